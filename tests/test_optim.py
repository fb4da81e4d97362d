"""What makes training steps faster: the tasks' AdamW (fused where the device has the kernel, the same update as
the unfused one, resumable from either's saved state), and LanguageModelTask's compile option."""

import pytest
import torch
from torch import nn

import zoo
from zoo.training.optim import adamw, parameter_groups


def _stepped(optimizer, model, grads, steps=3):
    for _ in range(steps):
        for p, g in zip(model.parameters(), grads):
            p.grad = g.clone()
        optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


def test_adamw_is_fused_on_the_cpu_and_makes_the_unfused_update():
    torch.manual_seed(0)
    a = zoo.create("gpt-tiny", depth=1, context_length=16)
    b = zoo.create("gpt-tiny", depth=1, context_length=16)
    b.load_state_dict(a.state_dict())
    groups = parameter_groups(a, 0.1)
    fused = adamw(groups, 1e-2)
    assert fused.defaults["fused"] and all(g["fused"] for g in fused.param_groups)
    plain = torch.optim.AdamW(parameter_groups(b, 0.1), lr=1e-2, betas=(0.9, 0.95))
    grads = [torch.randn_like(p) for p in a.parameters()]
    for x, y in zip(_stepped(fused, a, grads), _stepped(plain, b, grads)):
        torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)


def test_adamw_falls_back_where_there_is_no_fused_kernel():
    weight = nn.Parameter(torch.zeros(4, 4, dtype=torch.complex64))  # the fused kernel takes real floats only
    groups = [{"params": [weight], "weight_decay": 0.0}]
    optimizer = adamw(groups, 1e-3)
    assert not optimizer.defaults["fused"] and not optimizer.param_groups[0]["fused"]
    weight.grad = torch.ones_like(weight)
    optimizer.step()
    assert weight.abs().sum() > 0


def test_adamw_resumes_from_an_unfused_or_a_fused_state():
    torch.manual_seed(0)
    model = zoo.create("gpt-tiny", depth=1, context_length=16)
    grads = [torch.randn_like(p) for p in model.parameters()]
    for saved in (torch.optim.AdamW(parameter_groups(model, 0.1), lr=1e-3), adamw(parameter_groups(model, 0.1), 1e-3)):
        _stepped(saved, model, grads, steps=1)
        resumed = adamw(parameter_groups(model, 0.1), 1e-3)
        resumed.load_state_dict(saved.state_dict())
        # the saved groups' settings are restored with their state: an unfused run goes on unfused
        assert bool(resumed.param_groups[0]["fused"]) == bool(saved.param_groups[0]["fused"])
        before = [p.detach().clone() for p in model.parameters()]
        after = _stepped(resumed, model, grads, steps=1)
        assert all(torch.isfinite(p).all() for p in after) and any(not torch.equal(x, y) for x, y in
                                                                   zip(before, after))
        assert int(resumed.state[next(iter(model.parameters()))]["step"]) == 2


# ---- LanguageModelTask(compile=True) ----------------------------------------------------------------------------


def _tiny_text_task(tmp_path, **kw):
    import lightning as L

    from zoo.data import CharText
    from zoo.training import LanguageModelTask

    L.seed_everything(0)
    text = tmp_path / "t.txt"
    text.write_text("to be, or not to be, that is the question. " * 200)
    dm = CharText(path=str(text), context_length=16, batch_size=4, train_samples=4 * 6, val_windows=4)
    task = LanguageModelTask("gpt-tiny", {"depth": 1, "embed_dim": 32, "num_heads": 2, "context_length": 16},
                             dm.data_info, warmup_steps=2, sample_tokens=0, **kw)
    trainer = L.Trainer(default_root_dir=tmp_path, accelerator="cpu", devices=1, logger=False, max_epochs=1,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    return task, dm, trainer


def test_compile_is_off_by_default_and_refuses_what_is_not_a_flag(tmp_path):
    task, _, _ = _tiny_text_task(tmp_path)
    assert task._training_model() is None and task._compiled is None
    with pytest.raises(TypeError, match="compile must be true or false"):
        _tiny_text_task(tmp_path, compile="yes")


@pytest.mark.slow  # compiles a one-block model: ~15 s
def test_compile_trains_through_the_compiled_forward_and_keeps_the_model_itself(tmp_path):
    task, dm, trainer = _tiny_text_task(tmp_path, compile=True)
    before = {k: v.clone() for k, v in task.model.state_dict().items()}
    trainer.fit(task, dm)
    model, compiled = task._compiled
    assert model is task.model and compiled is not model
    # the checkpoint's keys are the model's own: nothing of the compiled wrapper is a submodule of the task
    assert not any("_orig_mod" in k or "_compiled" in k for k in task.state_dict())
    assert any(not torch.equal(before[k], v) for k, v in task.model.state_dict().items())
    x = next(iter(dm.val_dataloader()))[0]
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), task.model(x), rtol=1e-4, atol=1e-4)
