"""The gate's core: versioned results, pure statistics, evidence, verdicts, baselines, reports and the
subject protocol. It imports nothing outside ``ci.core`` and names no subject's quantities; a subject is a
package ``ci.<name>`` with a ``subject`` module that registers itself (``ci.core.subjects``)."""
