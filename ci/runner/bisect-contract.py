"""The contract of a bisect step (``ci.runner.bisect``): two commits of vLLM, not a change under review.

A commit of vLLM may change any path, the non-EP one included (a commit that moves a tile threshold changes
the tile non-EP callers get, and their output rounds differently, as it should): the bisect asks where the
bench got slower, not whether a change kept a promise. So every path is declared, no exact rule is checked,
and the entry module is the subject entry that reaches every changed module, as without a contract. The
builds still refuse wrong numbers: a non-EP case whose output differs with the same tile on both sides, or
any case beyond the bench's bound, is not timed.
"""

NAME = "between-commits"
UPSTREAM = "vLLM's own history: the two commits of a bisect step"
SUMMARY = "two commits of vLLM: every path may change, no rule is checked"
CHANGES_NON_EP = True
CHANGES_EP = True
CHANGES_BATCHED = True
ENTRY_MODULE = None
