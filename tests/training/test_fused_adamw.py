"""The fused AdamW's found_inf path: a private PyTorch contract the on-device guard will use."""

from __future__ import annotations

import torch


def test_found_inf_leaves_weights_moments_and_step_count_unchanged() -> None:
    """With ``found_inf`` set, a fused step changes nothing (issue 31: the device-side skip)."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1, fused=True)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()  # moments and a step count to keep
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = {id(p): {k: v.clone() for k, v in opt.state[p].items()} for p in model.parameters()}
    model(torch.randn(3, 4)).sum().backward()
    opt.found_inf = torch.tensor(1.0)
    opt.step()
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    for p in model.parameters():
        for k, v in opt.state[p].items():
            assert torch.equal(v, state[id(p)][k]), k
    opt.found_inf = torch.tensor(0.0)
    opt.step()  # and an ordinary step still moves the weights
    assert not torch.equal(model.weight, before["weight"])
