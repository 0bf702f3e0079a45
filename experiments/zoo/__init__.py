"""The model zoo: every model the experiments run, and what turns a prompt into its inputs.

Below the papers and below patching, so that both can use it without climbing:

    core, data            errors, run folders, the cache folder
      ^
    zoo                   imports only core, data and itself
      ^
    patching              context -> weights; imports zoo, core, data
      ^
    dherin, goldwaser, karbevski, xu_fang    the papers; import any of the above
      ^
    cli, benchmarks

tests/zoo/test_layering.py reads every module's imports and fails on one that climbs, or on a cycle.

One job per file:
- loading.py         a model by name (`load_model`, `check_model`): hub ids, local folders, GGUF, the
                     offline random models of the non-Gemma families (`tiny_config`); memory checked
                     before anything is allocated
- gemma.py           the offline Gemma 3 models (tiny text, 1B shape, tiny vision)
- gguf.py            a GGUF (gemma-3-270m, PATH.gguf) converted once into a cached checkpoint folder
- tokenizer.py       the offline byte-level tokenizer and Gemma's chat template
- random_weights.py  seeded random weights that behave enough like trained ones
- float64.py         float64 end to end (transformers' own float32 steps re-run in float64)
- bundle.py          ModelBundle: a model with its tokenizer (and processor)
- prompts.py         a user turn as model inputs; the stop tokens of a reply
- vision.py          context images: a file or a seeded synthetic one
- threads.py         one CPU thread for small models
- quiet.py           transformers' logging off while loading
- architectures.py   the gate: which architectures are worth loading

Two things the zoo needs come from above it, and flow down by registration, never by import:
- which architectures can be patched: experiments/patching/arch/__init__.py installs its `adapter_for`
  in architectures.py when it is imported; the zoo calls `architectures.require(model_type)` before it
  reads a weight or converts a GGUF.
- the tiny test configs, if the adapters come to carry them: they must not be imported here either. The
  offline registry in loading.py builds them from transformers' config classes today (no adapter
  needed); an adapter that owns its tiny config should hand it to the zoo the same way (patching
  calling into the zoo at import), or name the zoo's model (`tiny-llama`) instead of holding its config.
"""
