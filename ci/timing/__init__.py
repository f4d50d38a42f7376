"""How the benches time work on the GPU: CUDA graphs, the one timer, the injected sleep (``graphs``), the
capture schedule (``captures``), and, before timing, whether the builds' outputs agree (``agreement``). Used by
every subject's bench; imports only ``ci.core``."""
