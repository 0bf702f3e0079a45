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
                     offline random models (the catalog's tiny ones: `tiny_config`); memory checked
                     before anything is allocated
- catalog.py         what a caller above the zoo tells the loader (`Catalog`): more offline models, a
                     config's check, loader keywords, the loaded model's check
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

The zoo imports nothing above it, not even inside a function (tests/zoo/test_layering.py). What patching
knows about loading (which architectures can be patched, checked before a weight is read or a GGUF
converted; the adapter checked against the loaded model's stock decoder layers; the families' tiny test
models; what an adapter asks of `from_pretrained`) reaches the loader as an argument, a `Catalog`
(catalog.py) that patching/load.py builds and passes: `load_checked`, `check_patchable`. Chosen over a
registry that patching fills when it is imported: with that, what `load_model` accepts would depend on what
the caller happened to import first.
"""
