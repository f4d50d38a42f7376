"""The machine a stage runs on: its GPUs (presence, fingerprint, state sampled during a run), this run's own
processes, and the names of the files the stages write. Below the trees and the subjects: any of them may
import it; it imports only ``ci.core``."""
