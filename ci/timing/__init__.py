"""How the benches time work on the GPU: CUDA graphs, the one timer, the injected sleep (``graphs``), and the
capture schedule (``captures``). Used by every subject's bench; imports only ``ci.core``."""
