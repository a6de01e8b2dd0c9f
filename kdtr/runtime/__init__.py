"""The GPU runtime: our cubins compiled with NVRTC and cached (`nvrtc`), loaded into torch's context
and launched on its stream (`device`, with the stand-in hook the CPU emulator plugs into), which GPU a
record's numbers come from (`gpu_identity`) and runs under compute-sanitizer (`sanitize`). It may
import the root modules and nothing else of kdtr."""
