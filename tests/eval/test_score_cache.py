import json
import os

from compress.eval.score_cache import model_fingerprint


def test_fingerprint_follows_the_weights_not_the_recorded_results(tmp_path):
    weights, manifest = tmp_path / "model.safetensors", tmp_path / "compress.json"
    weights.write_bytes(b"\0" * 64)
    manifest.write_text(json.dumps({"method": "awq"}))
    before = model_fingerprint(tmp_path)
    manifest.write_text(json.dumps({"method": "awq", "quality": {"mmlu": 0.25}}))  # what an eval records
    assert model_fingerprint(tmp_path) == before
    weights.write_bytes(b"\1" * 64)
    os.utime(weights, ns=(1, 1))  # same size: the mtime tells the new weights apart
    assert model_fingerprint(tmp_path) != before
