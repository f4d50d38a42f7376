"""What every MoE subject shares: the MoE shapes of real models (``shapes``), routing and a rank's view
(``routing``), the one way vLLM's modules are patched (``patching``), and the rules of vLLM's MoE code written
from their specifications (``spec``: #48144's M estimate, Marlin's tile rule), which contracts use. Below the
subjects and the trees; imports only ``ci.core`` and itself."""
