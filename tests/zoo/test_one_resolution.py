"""One resolution: a model's config is resolved once, however many steps ask for it (a check, the load's own check
outside a job's scope, the loader), and a local folder never probes the hub."""

from __future__ import annotations

import socket


def test_a_job_resolves_its_models_config_once_and_a_folder_probes_no_hub(tmp_path, monkeypatch):
    from cli.overrides import validate
    from experiments.patching.arch import tiny
    from experiments.zoo import loading
    from tests.helpers.in_process import run_claims

    folder = str(tiny.save_checkpoint("olmo3", tmp_path / "olmo3"))
    asked, probes = [], []
    real_resolve, real_connect = loading._resolve_config, socket.create_connection

    def resolve(name, stamp, offline):
        asked.append(name)
        return real_resolve(name, stamp, offline)

    monkeypatch.setattr(loading, "_resolve_config", resolve)
    monkeypatch.setattr(socket, "create_connection", lambda *a, **k: probes.append(a) or real_connect(*a, **k))
    before = real_resolve.cache_info()
    overrides = (f"model={folder}", "variant=naive", "max_new_tokens=2", "dtype=float32")
    validate("patch_match", [*overrides, "preset=smoke", "device=cpu"], multirun=False)
    run_claims("patch_match", tmp_path / "run", *overrides)
    after = real_resolve.cache_info()
    assert asked.count(folder) >= 3  # validate, the load (no command here: zoo/kept_checks.py), the loader
    assert after.misses - before.misses == 1  # ... and one resolution among them
    assert not probes


def test_a_changed_config_json_is_resolved_again(tmp_path):
    import json

    from experiments.patching.arch import tiny
    from experiments.zoo.loading import resolve_config

    folder = tiny.save_checkpoint("olmo3", tmp_path / "olmo3")
    first, _ = resolve_config(str(folder))
    first.num_hidden_layers = 99  # a caller's change stays its own
    path = folder / "config.json"
    data = json.loads(path.read_text())
    data["vocab_size"] = data["vocab_size"] + 1
    path.write_text(json.dumps(data))
    again, _ = resolve_config(str(folder))
    assert again.vocab_size == data["vocab_size"] and again.num_hidden_layers != 99
