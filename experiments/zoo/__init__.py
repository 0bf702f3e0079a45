"""The model zoo: every model the experiments run, and what turns a prompt into its inputs.

Below the papers and below patching, so that both can use it without climbing:

    core, data            errors, run folders, the cache folder
      ^
    zoo                   imports only core, data and itself (and, at call time, patching.arch:
                          see architectures.py)
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
- gguf.py            a GGUF (a registry model, PATH.gguf) converted once into a cached checkpoint folder
- bundled_gguf.py    the registry's trained models (one table: 270M, 0.5B, 1.5B): chunk packages located as
                     data, joined, checked
- gguf_metadata.py   a GGUF's header (architecture, chat template), no weight read
- staging.py         all-or-nothing writes into the model cache
- tokenizer.py       the offline byte-level tokenizer and Gemma's chat template
- random_weights.py  seeded random weights that behave enough like trained ones
- float64.py         float64 end to end (transformers' own float32 steps re-run in float64)
- bundle.py          ModelBundle: a model with its tokenizer (and processor)
- prompts.py         a user turn as model inputs; the stop tokens of a reply
- vision.py          context images: a file or a seeded synthetic one
- threads.py         one CPU thread for small models
- quiet.py           transformers' logging off while loading
- architectures.py   the zoo's one window onto the adapters: which architectures are worth loading

What the zoo needs from above it, it asks through architectures.py, inside functions only:
- which architectures can be patched (an adapter in experiments/patching/arch/, or Llama's module names
  read on the meta device), checked before a weight is read or a GGUF converted; and, once a model is
  loaded, its adapter checked against its stock decoder layers (`check_block`);
- the adapters' tiny test models (names and configs) and what an adapter asks of the loader
  (`load_kwargs`). loading.py asks for the names once, when it is imported: importing zoo.loading
  imports the adapters; the rest of the zoo, which patching uses, never imports patching.
Chosen over a registry that patching fills when it is imported: with that, what `load_model` accepts
would depend on what the caller happened to import first. The cycle test keeps patching from importing
zoo.loading (which would close a cycle); test_layering allows exactly this window, inside functions only.
"""
