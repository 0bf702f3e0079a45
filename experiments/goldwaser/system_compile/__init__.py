"""system_compile: a system prompt compiled into the weights, the analytic fixed patch against prompt baking
(a LoRA trained on the KL), measured on user queries neither was fitted on. See experiment.py.

The registry reads EXPERIMENT from this package; it is imported on first use, so that the schema
(schema.py, torch- and pandas-free) can be registered without importing the experiment."""


def __getattr__(name: str):
    if name == "EXPERIMENT":
        from experiments.goldwaser.system_compile.experiment import EXPERIMENT

        return EXPERIMENT
    raise AttributeError(name)
