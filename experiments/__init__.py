"""icl-exp experiments: one module per experiment (named as on the command line), built from
small pure pieces in `patching/`, `models/`, `data/` and the run machinery in `core/`."""
