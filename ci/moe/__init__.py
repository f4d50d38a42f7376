"""What every MoE subject shares: the MoE shapes of real models (``shapes``), routing and a rank's view
(``routing``), the one way vLLM's modules are patched (``patching``), the rules of vLLM's MoE code written from
their specifications (``spec``: #48144's M estimate, Marlin's tile rule; contracts use it) and the tile a build's
own code picks (``picks``: the kernel bench and TPOT both report it). Below the subjects and the trees; imports
only ``ci.core`` and itself."""
