"""The vLLM trees under test: a release unpacked once, the change applied (a patch, a branch or a change
folder of ``ci/changes/``), its contract, the manifest of the two trees, what differs between them, and
the candidate's modules imported beside the base's."""
