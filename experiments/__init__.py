"""icl-exp experiments, one package per paper (dherin/, goldwaser/, karbevski/, xu_fang/), each with
its experiments (one module per experiment, named as on the command line) and the math only it uses.
Shared: `core/` (runner, run folder, claims, plotting), `patching/` (context -> weight patches for
Dherin and Goldwaser), `data/` (samplers and corpora)."""
