import torch
from torch import nn

from compress.calib import record_inputs


def test_recorded_statistics_cover_every_token():
    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(8, 6), nn.Linear(6, 4))
    x = torch.randn(5, 7, 8)  # [N, T, C]
    stats = record_inputs(block, x, ["1"], keep_seqs=2, keep_tokens=10, seed=0, batch=2, gram=True)["1"]
    h = block[0](x).reshape(-1, 6)  # [N*T, 6]: what the second Linear sees
    torch.testing.assert_close(stats["gram"], h.T @ h / h.shape[0])
    torch.testing.assert_close(stats["mean_abs"], h.abs().mean(0))
    assert stats["sequences"].shape == (2, 7, 6) and stats["tokens"].shape == (10, 6)
    assert "gram" not in record_inputs(block, x, ["1"], 2, 10, seed=0)["1"]
