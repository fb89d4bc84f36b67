"""Agents (explainers/agents): mask rule, environments, the V(s)-CAM identity, the CAMAL term, PPO pieces, training
(a few hundred environment steps), resuming, evaluation caps. ViZDoom-dependent tests skip without ViZDoom."""
from collections import namedtuple

import numpy as np
import pytest
import torch

from explainers.agents import envs
from explainers.agents.envs import FRAME_HW, ScenarioError, relevant_mask, scenario
from explainers.agents.networks import build_network, value_cam, value_cam_per_sample
from explainers.agents import ppo
from explainers.agents.ppo import PPOConfig, Rollout, camal_term, clipped_step, ppo_loss, ppo_update, weighted_step

needs_vizdoom = pytest.mark.skipif(not envs.vizdoom_available(), reason="ViZDoom is not installed")
Label = namedtuple("Label", "value object_name")
TINY = dict(num_envs=2, rollout_steps=32, minibatch=32, epochs=1)
SMALL_NET = {"width": 8, "hidden": 32}  # a quarter of the shipped width: the same code, seconds on a CPU


def test_mask_rule_keeps_only_relevant_objects_at_network_resolution():
    buffer = np.zeros((120, 160), np.uint8)
    buffer[10:30, 20:40] = 7    # a monster: 20 x 20 source pixels -> 10 x 10 network pixels
    buffer[60:80, 100:120] = 9  # a bullet puff: not in the rule
    buffer[100, 0] = 7          # one source pixel: 1/4 of a network pixel, exactly the coverage threshold
    buffer[110, 0] = 0
    labels = [Label(7, "Demon"), Label(9, "BulletPuff")]
    mask = relevant_mask(buffer, labels, scenario("defend_the_center").relevant)
    assert mask.shape == FRAME_HW
    assert mask[5:15, 10:20].all() and mask.sum() == 100 + 1
    assert not mask[30:40, 50:60].any()
    assert not relevant_mask(buffer, labels, ("Medikit",)).any()


def test_unknown_scenario_and_missing_vizdoom_are_plain_sentences(monkeypatch):
    with pytest.raises(ScenarioError, match="Unknown scenario 'doom3'. Available: defend_the_center"):
        scenario("doom3")
    monkeypatch.setattr(envs, "vizdoom_available", lambda: False)
    with pytest.raises(ScenarioError, match="pip install"):
        envs.make_env("defend_the_center")


@needs_vizdoom
@pytest.mark.parametrize("name", ["defend_the_center", "health_gathering"])
def test_environment_frames_and_masks(name):
    vec = envs.VecEnv(name, 2, seed=5)
    try:
        frames, masks = vec.reset()
        assert frames.shape == (2, 3, *FRAME_HW) and frames.dtype == np.uint8 and masks.shape == (2, *FRAME_HW)
        seen = masks.any(axis=(1, 2)).sum()
        rng = np.random.default_rng(0)
        for _ in range(100):  # 200 environment steps
            frames, masks, rewards, dones, finished = vec.step(rng.integers(0, vec.num_actions, 2))
            seen += masks.any(axis=(1, 2)).sum()
        assert seen > 20, "the relevant objects (monsters, medkits) are in view in many frames"
        assert 0 < masks.mean() < 0.5
    finally:
        vec.close()


@needs_vizdoom
def test_same_seed_same_episode():
    first, second = envs.make_env("defend_the_center"), envs.make_env("defend_the_center")
    try:
        a, b = first.reset(seed=11), second.reset(seed=11)
        for action in [0, 1, 3, 3, 2] * 6:
            a, b = first.step(action), second.step(action)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    finally:
        first.close()
        second.close()


@pytest.mark.parametrize("arch", ["cnn", "vit"])
def test_batch_level_value_cam_equals_per_frame(arch):
    torch.manual_seed(0)
    net = build_network(arch, 4).eval()
    frames = torch.randint(0, 256, (6, 3, *FRAME_HW), dtype=torch.uint8)
    batch = value_cam(net, frames)[0]
    assert batch.shape == (6, *FRAME_HW) and float(batch.max()) > 0
    assert torch.allclose(batch, value_cam_per_sample(net, frames), atol=1e-5)
    peaks = batch.flatten(1).amax(1)  # each map divided by its maximum (an all-negative CAM stays all zero)
    assert all(float(p) == pytest.approx(1.0) or float(p) == 0.0 for p in peaks) and float(peaks.max()) == 1.0


def test_camal_term_known_answer_and_empty_masks_add_nothing():
    cams = torch.zeros(3, 4, 4)
    cams[:, :2] = 1.0  # top half hot
    masks = torch.zeros(3, 4, 4, dtype=torch.bool)
    masks[0, :2] = True    # mask = hot half: alpha 1, beta 0
    masks[1, 2:] = True    # mask = cold half: alpha 0, beta 1
    gap, usable, alpha, beta = camal_term(cams, masks)  # frame 2: empty mask
    assert usable == 2 and float(gap) == pytest.approx(0.0) and float(alpha) == 1.0 and float(beta) == 1.0
    full = torch.ones(1, 4, 4, dtype=torch.bool)
    assert camal_term(cams[:1], full)[1] == 0


def test_camal_term_at_the_cam_grid_equals_the_term_of_the_upsampled_map():
    """The loss reads the map at the CAM layer's grid and carries the masks there by the adjoint of the
    upsampling: alpha and beta (and their gradients) must be those of the upsampled map."""
    from explainers.resize import resize_bilinear_adjoint

    generator = torch.Generator().manual_seed(0)
    grid = torch.rand(4, 15, 20, generator=generator, requires_grad=True)
    masks = torch.rand(4, *FRAME_HW, generator=generator) < 0.2
    masks[3] = False  # no term
    upsampled = torch.nn.functional.interpolate(grid[:, None], size=FRAME_HW, mode="bilinear",
                                                align_corners=False)[:, 0]
    full = camal_term(upsampled, masks)
    cheap = camal_term(grid, masks)
    assert full[1] == cheap[1] == 3
    assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip((full[0], full[2], full[3]), (cheap[0], cheap[2], cheap[3])))
    (full_grad,) = torch.autograd.grad(full[0], grid)
    (cheap_grad,) = torch.autograd.grad(cheap[0], grid)
    assert torch.allclose(full_grad, cheap_grad, atol=1e-6) and float(full_grad.abs().sum()) > 0
    m = torch.rand(2, *FRAME_HW, generator=generator)
    assert torch.allclose((upsampled[:2] * m).sum(), (grid[:2] * resize_bilinear_adjoint(m, (15, 20))).sum(),
                          rtol=1e-5)


def test_camal_loss_is_differentiable_and_moves_the_cam_into_the_mask():
    torch.manual_seed(0)
    net = build_network("cnn", 4, **SMALL_NET)
    frames = torch.randint(0, 256, (16, 3, *FRAME_HW), dtype=torch.uint8)
    masks = torch.zeros(16, *FRAME_HW, dtype=torch.bool)
    masks[:, 20:40, 50:70] = True
    masks[3] = False  # an empty mask: no term
    config = PPOConfig(camal_lambda=10.0)
    optimizer = torch.optim.Adam(net.parameters(), lr=1e-3)
    actions, zeros = torch.zeros(16, dtype=torch.long), torch.zeros(16)

    def inside_share():
        cams = value_cam(net, frames)[0].detach()
        return float((cams * masks).sum() / cams.sum())

    before = inside_share()
    for _ in range(25):
        loss, camal, parts = ppo_loss(net, frames, masks, actions, zeros - 1.386, torch.randn(16), zeros, config)
        parts.update(clipped_step(net, optimizer, loss, camal, config))
    assert parts["camal_frames"] == pytest.approx(15 / 16) and parts["camal_grad_norm"] > 0
    assert inside_share() > 2 * before


def test_ppo_and_camal_gradients_are_clipped_apart():
    """A CAMAL gradient far larger than the PPO gradient must not shrink the PPO step: the step is the sum of the
    two gradients, each clipped to its own norm."""
    torch.manual_seed(1)
    net = build_network("cnn", 4, **SMALL_NET)
    frames = torch.randint(0, 256, (8, 3, *FRAME_HW), dtype=torch.uint8)
    masks = torch.zeros(8, *FRAME_HW, dtype=torch.bool)
    masks[:, 5:25, 10:40] = True
    config = PPOConfig(camal_lambda=1000.0, max_grad_norm=0.5, camal_max_grad_norm=0.25)
    loss, camal, _ = ppo_loss(net, frames, masks, torch.arange(8) % 4, torch.zeros(8) - 1.386, torch.randn(8),
                              torch.randn(8), config)
    params = list(net.parameters())
    references = []
    for part, limit in ((loss, 0.5), (camal, 0.25)):
        grads = [torch.zeros_like(p) if g is None else g
                 for g, p in zip(torch.autograd.grad(part, params, retain_graph=True, allow_unused=True), params)]
        norm = torch.sqrt(sum((g ** 2).sum() for g in grads))
        references.append((grads, float(norm), min(1.0, limit / float(norm))))
    before = [p.detach().clone() for p in params]
    norms = clipped_step(net, torch.optim.SGD(params, lr=1.0), loss, camal, config)
    (g_ppo, n_ppo, f_ppo), (g_camal, n_camal, f_camal) = references
    assert norms["ppo_grad_norm"] == pytest.approx(n_ppo, rel=1e-4)
    assert norms["camal_grad_norm"] == pytest.approx(n_camal, rel=1e-4) and n_camal > 10 * n_ppo
    for b, p, gp, gc in zip(before, params, g_ppo, g_camal):
        assert torch.allclose(b - p.detach(), f_ppo * gp + f_camal * gc, atol=1e-6)
    ppo_part = torch.sqrt(sum(((b - p.detach() - f_camal * gc) ** 2).sum() for b, p, gc in zip(before, params, g_camal)))
    assert float(ppo_part) == pytest.approx(min(n_ppo, 0.5), rel=1e-3)  # one shared clip would give ~0.5 * n_ppo / n_camal


def test_weighted_step_is_the_clipped_sum_in_one_backward():
    """Between two measurements of the clip factors, one backward of f_ppo * loss + f_camal * camal gives the step
    `clipped_step` would give with those factors."""
    torch.manual_seed(2)
    net = build_network("cnn", 4, **SMALL_NET)
    frames = torch.randint(0, 256, (8, 3, *FRAME_HW), dtype=torch.uint8)
    masks = torch.zeros(8, *FRAME_HW, dtype=torch.bool)
    masks[:, 5:25, 10:40] = True
    config = PPOConfig(camal_lambda=1000.0)
    loss, camal, _ = ppo_loss(net, frames, masks, torch.arange(8) % 4, torch.zeros(8) - 1.386, torch.randn(8),
                              torch.randn(8), config)
    params = list(net.parameters())
    g_ppo, g_camal = ([torch.zeros_like(p) if g is None else g
                       for g, p in zip(torch.autograd.grad(part, params, retain_graph=True, allow_unused=True), params)]
                      for part in (loss, camal))
    factors = {"ppo_factor": 0.3, "camal_factor": 0.02}
    before = [p.detach().clone() for p in params]
    weighted_step(net, torch.optim.SGD(params, lr=1.0), loss, camal, factors)
    for b, p, gp, gc in zip(before, params, g_ppo, g_camal):
        assert torch.allclose(b - p.detach(), 0.3 * gp + 0.02 * gc, atol=2e-4)  # float32 sums in two orders


@pytest.mark.parametrize("norm_every, measured", [(1, 16), (4, 4), (100, 1)])
def test_norm_every_measures_the_clip_factors_on_every_kth_minibatch(monkeypatch, norm_every, measured):
    calls = {"clipped": [], "weighted": []}
    real_clipped, real_weighted = ppo.clipped_step, ppo.weighted_step

    def clipped(*args, **kwargs):
        norms = real_clipped(*args, **kwargs)
        calls["clipped"].append(norms)
        return norms

    def weighted(net, optimizer, loss, camal, factors):
        calls["weighted"].append(dict(factors))
        real_weighted(net, optimizer, loss, camal, factors)

    monkeypatch.setattr(ppo, "clipped_step", clipped)
    monkeypatch.setattr(ppo, "weighted_step", weighted)
    torch.manual_seed(3)
    config = PPOConfig(num_envs=2, rollout_steps=16, minibatch=4, epochs=2, camal_lambda=1.0, norm_every=norm_every)
    net = build_network("cnn", 4, **SMALL_NET)
    rollout = Rollout(16, 2, (3, *FRAME_HW), "cpu")
    rollout.frames = torch.randint(0, 256, rollout.frames.shape, dtype=torch.uint8)
    rollout.masks[:, :, 10:30, 20:50] = True
    rollout.rewards = torch.randn(rollout.rewards.shape)
    result = ppo_update(net, torch.optim.Adam(net.parameters(), lr=1e-4), rollout, torch.zeros(2), config,
                        torch.Generator().manual_seed(0))
    assert len(calls["clipped"]) == measured and len(calls["weighted"]) == 16 - measured
    # every weighted step reuses the factors of the measurement before it, and the logged norms are the measured ones
    last = calls["clipped"][-1]
    assert all(f == {"ppo_factor": last["ppo_factor"], "camal_factor": last["camal_factor"]}
               for f in calls["weighted"][-(16 - measured) // measured:] if measured < 16)
    assert result["camal_grad_norm"] == pytest.approx(np.mean([c["camal_grad_norm"] for c in calls["clipped"]]))
    assert "camal_factor" not in result and result["camal_frames"] == pytest.approx(1.0)


@pytest.mark.parametrize("arch,options,frame_hw,grid", [("cnn", SMALL_NET, (100, 156), (25, 39)),
                                                         ("nature", {"hidden": 32}, (100, 156), (9, 16)),
                                                         ("nature", {"hidden": 32}, (60, 80), (4, 6))])
def test_networks_take_their_frame_size_and_maps_follow_it(arch, options, frame_hw, grid):
    from explainers.agents.networks import frame_hw_of, network_from_arch

    net = build_network(arch, 3, frame_hw=frame_hw, **options)
    frames = torch.randint(0, 256, (2, 3, *frame_hw), dtype=torch.uint8)
    cams, logits, values = value_cam(net, frames)
    assert cams.shape == (2, *frame_hw) and logits.shape == (2, 3) and values.shape == (2,)
    assert value_cam(net, frames, at_grid=True)[0].shape == (2, *grid)
    again = network_from_arch(net.arch)
    assert frame_hw_of(again) == frame_hw and again.arch == net.arch
    buffer = np.zeros((240, 320), np.uint8)
    buffer[40:80, 100:140] = 7
    mask = relevant_mask(buffer, [Label(7, "Demon")], ("Demon",), frame_hw)
    assert mask.shape == frame_hw and 0 < mask.mean() < 0.05


def test_detached_weights_mode_needs_no_second_order_graph_and_keeps_the_gradients():
    """cam_mode "detach-weights": the gradient of the map's loss reaches the parameters through the activations
    only, so it must equal the gradient of the full second-order graph with the channel weights cut, while the
    V gradient itself is taken without create_graph (the cheaper update)."""
    from explainers.agents.networks import cams_from

    torch.manual_seed(0)
    net = build_network("cnn", 4, **SMALL_NET)
    frames = torch.randint(0, 256, (5, 3, *FRAME_HW), dtype=torch.uint8)
    masks = torch.zeros(5, *FRAME_HW, dtype=torch.bool)
    masks[:, 10:30, 20:50] = True

    def parameter_gradients(cams):
        net.zero_grad()
        camal_term(cams, masks)[0].backward()
        return {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}

    cheap = parameter_gradients(value_cam(net, frames, differentiable=True, detach_weights=True)[0])
    _, values, features = net(frames, return_features=True)
    (second_order,) = torch.autograd.grad(values.sum(), features, create_graph=True)
    reference = parameter_gradients(cams_from(net, features, second_order, detach_weights=True))
    assert sorted(cheap) == sorted(reference) and any(n.startswith("stem") for n in cheap)
    assert all(torch.allclose(cheap[n], reference[n], atol=1e-6) for n in cheap)
    # the full mode also moves the layers after the CAM layer, through the channel weights (second order)
    full = parameter_gradients(value_cam(net, frames, differentiable=True)[0])
    assert any(n.startswith("head") for n in full) and not any(n.startswith("head") for n in cheap)


def test_gae_matches_a_hand_computation():
    rollout = Rollout(3, 1, (3, *FRAME_HW), "cpu")
    rollout.rewards[:, 0] = torch.tensor([1.0, 0.0, 2.0])
    rollout.values[:, 0] = torch.tensor([0.5, 0.25, 1.0])
    rollout.dones[:, 0] = torch.tensor([0.0, 1.0, 0.0])  # the episode ends at step 1
    gamma, lam = 0.9, 0.8
    advantages, returns = rollout.advantages(torch.tensor([4.0]), gamma, lam)
    a2 = 2.0 + gamma * 4.0 - 1.0
    a1 = 0.0 - 0.25  # terminal: no bootstrap, no carry
    a0 = (1.0 + gamma * 0.25 - 0.5) + gamma * lam * a1
    assert torch.allclose(advantages[:, 0], torch.tensor([a0, a1, a2]))
    assert torch.allclose(returns, advantages + rollout.values)


@needs_vizdoom
def test_training_writes_an_agent_and_resumes_after_a_kill(tmp_path):
    from explainers.agents.checkpoint import load_agent
    from explainers.agents.train import train_agent

    first = train_agent(scenario_name="defend_the_center", out_dir=tmp_path, name="a", seed=3, lam=1.0,
                        steps=64, config=PPOConfig(**TINY), net_options=SMALL_NET, iou_every=1)
    assert first["steps"] == 64 and first["history"][0]["iou"] >= 0 and "camal_gap" in first["history"][0]
    # a killed job: the checkpoint is there, the next run continues from it
    again = train_agent(scenario_name="defend_the_center", out_dir=tmp_path, name="a", seed=3, lam=1.0,
                        steps=128, config=PPOConfig(**TINY), net_options=SMALL_NET, iou_every=1)
    assert again["steps"] == 128 and again["updates"] == 2 and len(again["history"]) == 2
    net, card = load_agent(tmp_path / "a.json")
    assert card["resumes"] == 1 and card["lambda"] == 1.0 and card["steps"] == 128
    assert card["mask_rule"] == ["MarineChainsawVzd", "Demon"]


@needs_vizdoom
def test_an_agent_trained_with_the_status_bar_sees_it_in_training_evaluation_and_its_card(tmp_path):
    """--hud: the frames show Doom's status bar (the ammo count the scenario hides); the network records it, so
    its evaluation, its card and the command that remakes it follow."""
    from explainers.agents.checkpoint import load_agent
    from explainers.agents.cli import training_command
    from explainers.agents.evaluate import play_episode
    from explainers.agents.networks import hud_of

    plain, shown = (envs.make_env("defend_the_center", frame_hw=(100, 156), hud=hud) for hud in (False, True))
    try:
        bottom = [env.reset(seed=5)[0][:, -12:].astype(np.float32) for env in (plain, shown)]
    finally:
        plain.close()
        shown.close()
    assert np.abs(bottom[0] - bottom[1]).mean() > 20  # the bar's grey panel and red digits replace the floor
    summary = train_agent_tiny(tmp_path, "h", {**SMALL_NET, "frame_hw": (100, 156), "hud": True})
    net, card = load_agent(summary["card"])
    assert hud_of(net) and card["hud"] is True and net.arch["hud"] is True
    assert "--hud" in training_command(card, "h")
    episode = play_episode(net, "defend_the_center", 7, max_steps=3, keep_frames=True)
    assert np.abs(np.asarray(episode["frames"][0])[:, -12:].astype(np.float32) - bottom[0]).mean() > 20
    assert not hud_of(build_network("cnn", 3, **SMALL_NET)) and "hud" not in build_network("cnn", 3).arch


@needs_vizdoom
def test_an_episode_can_record_game_variables_beside_its_steps():
    """The ammo study reads the ammunition through the evaluation's own loop: the scenario hands out 26 rounds, the
    count never rises, and there is one reading after the reset and one after each step of an episode still going."""
    from explainers.agents.evaluate import play_episode

    net = build_network("cnn", 3, **SMALL_NET)
    episode = play_episode(net, "defend_the_center", 7, max_steps=40, game_variables=("AMMO2",))
    ammo = episode["game_variables"]["AMMO2"]
    assert ammo[0] == 26 and all(b <= a for a, b in zip(ammo, ammo[1:]))
    assert len(ammo) == episode["length"] + (1 if episode["capped"] else 0)
    assert "game_variables" not in play_episode(net, "defend_the_center", 7, max_steps=2)


def test_lambda_does_not_change_a_step_whose_camal_gradient_is_held_at_its_clip():
    """Why the comparison chooses CAMAL's clip, not lambda (bench/agents_recipe_gate.md): once the lambda-scaled
    CAMAL gradient is longer than its clip, lambda 1 and lambda 3 give the same optimiser step; under the clip they
    do not, and a smaller clip gives a shorter CAMAL step."""
    frames = torch.randint(0, 256, (8, 3, *FRAME_HW), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    masks = torch.zeros(8, *FRAME_HW, dtype=torch.bool)
    masks[:, 5:25, 10:40] = True

    def step(lam, clip):
        torch.manual_seed(0)
        net = build_network("cnn", 4, **SMALL_NET)
        config = PPOConfig(camal_lambda=lam, max_grad_norm=0.5, camal_max_grad_norm=clip)
        loss, camal, _ = ppo_loss(net, frames, masks, torch.arange(8) % 4, torch.zeros(8) - 1.386,
                                  torch.linspace(-1, 1, 8), torch.linspace(1, -1, 8), config)
        before = [p.detach().clone() for p in net.parameters()]
        norms = clipped_step(net, torch.optim.SGD(net.parameters(), lr=1.0), loss, camal, config)
        return torch.cat([(b - p.detach()).flatten() for b, p in zip(before, net.parameters())]), norms

    held = {lam: step(lam, 1e-4) for lam in (1.0, 3.0)}
    assert all(norms["camal_factor"] < 1 for _, norms in held.values())
    assert torch.allclose(held[1.0][0], held[3.0][0], atol=1e-7)
    free = {lam: step(lam, 1e6) for lam in (1.0, 3.0)}
    assert not torch.allclose(free[1.0][0], free[3.0][0], atol=1e-7)
    ppo_only = step(1e-12, 1e6)[0]
    shorter, longer = ((step(1.0, clip)[0] - ppo_only).norm() for clip in (1e-5, 1e-4))
    assert float(shorter) == pytest.approx(1e-5, rel=1e-2) and float(longer) == pytest.approx(1e-4, rel=1e-2)


def train_agent_tiny(out_dir, name, net_options):
    from explainers.agents.train import train_agent

    return train_agent(scenario_name="defend_the_center", out_dir=out_dir, name=name, seed=3, lam=0.0, steps=64,
                       config=PPOConfig(**TINY), net_options=net_options)


def test_linear_learning_rate_falls_to_zero_at_the_step_cap_and_needs_one():
    config = PPOConfig(lr=1e-4, lr_schedule="linear")
    assert [config.lr_at(done, 400) for done in (0, 100, 400, 500)] == pytest.approx([1e-4, 0.75e-4, 0.0, 0.0])
    assert PPOConfig(lr=1e-4).lr_at(300, 400) == 1e-4
    with pytest.raises(ValueError, match="step cap"):
        config.lr_at(0, None)
    with pytest.raises(ValueError, match="unknown learning-rate schedule"):
        PPOConfig(lr_schedule="cosine").lr_at(0, 400)


@needs_vizdoom
def test_a_resumed_run_follows_the_same_learning_rate_schedule(tmp_path):
    """The rate of each update reads the steps done, so a run stopped after its first update and resumed gives
    the updates the rates of one unbroken run: lr x (1 - 0/128), lr x (1 - 64/128)."""
    from explainers.agents.train import train_agent

    def run(name, steps):
        return train_agent(scenario_name="defend_the_center", out_dir=tmp_path, name=name, seed=3, steps=steps,
                           config=PPOConfig(**dict(TINY, lr=1e-3, lr_schedule="linear")), net_options=SMALL_NET)

    run("r", 64)  # stopped after one update, then resumed by a command with the whole run's cap
    resumed = run("r", 128)
    with pytest.raises(ValueError, match="step cap"):
        train_agent(scenario_name="defend_the_center", out_dir=tmp_path, name="n", seed=3, budget_s=5,
                    config=PPOConfig(**dict(TINY, lr_schedule="linear")), net_options=SMALL_NET)
    whole = run("w", 128)
    assert [record["lr"] for record in whole["history"]] == pytest.approx([1e-3, 0.5e-3])
    assert [record["lr"] for record in resumed["history"]] == pytest.approx([1e-3, 0.5e-3])


@needs_vizdoom
def test_vanilla_and_camal_share_seeds(tmp_path):
    from explainers.agents.train import train_agent

    runs = [train_agent(scenario_name="defend_the_center", out_dir=tmp_path, name=f"r{lam}", seed=4, lam=lam,
                        steps=64, config=PPOConfig(**TINY), net_options=SMALL_NET) for lam in (0.0, 1.0)]
    first = [run["history"][0] for run in runs]
    # the first rollout is played before any update: same seed, same actions, same episodes
    assert first[0]["episodes"] == first[1]["episodes"] and first[0]["return"] == first[1]["return"]
    assert "camal_gap" not in first[0]


@needs_vizdoom
def test_episode_cap_and_value_curves(tmp_path):
    from explainers.agents.evaluate import fidelity, play_episode, value_curves

    torch.manual_seed(0)
    net = build_network("cnn", 4, **SMALL_NET).eval()
    episode = play_episode(net, "defend_the_center", 10_000_001, max_steps=12, keep_frames=True)
    assert episode["capped"] and episode["length"] == 12 and episode["frames"].shape == (12, 3, *FRAME_HW)
    again = play_episode(net, "defend_the_center", 10_000_001, max_steps=12)
    assert again["actions"] == episode["actions"] and again["values"] == episode["values"]
    frames = torch.from_numpy(episode["frames"][:3])
    fractions, deletion, insertion = value_curves(net, frames, torch.rand(3, *FRAME_HW), reference="black")
    with torch.no_grad():
        full, black = net(frames)[1], net(torch.zeros_like(frames))[1]
    assert np.allclose(deletion[:, 0], full.numpy(), atol=1e-5) and np.allclose(deletion[:, -1], black.numpy(),
                                                                               atol=1e-5)
    assert np.allclose(insertion[:, 0], black.numpy(), atol=1e-5) and np.allclose(insertion[:, -1], full.numpy(),
                                                                                 atol=1e-5)
    _, blurred, _ = value_curves(net, frames, torch.rand(3, *FRAME_HW))
    assert np.allclose(blurred[:, 0], full.numpy(), atol=1e-5) and not np.allclose(blurred[:, -1], black.numpy())
    scores = fidelity(net, episode["frames"][:4])
    assert len(scores["deletion_auc"]) == len(scores["deletion_drop"]) == 4 and scores["value_spread"] > 0


@pytest.mark.parametrize("arch,options", [("cnn", SMALL_NET), ("vit", {"dim": 32, "depth": 2, "heads": 2,
                                                                       "hidden": 32})])
def test_registry_methods_on_agents(arch, options):
    from explainers.agents.saliency import agent_method_choices, agent_methods, explain_frames

    torch.manual_seed(0)
    net = build_network(arch, 4, **options).eval()
    frames = torch.randint(0, 256, (2, 3, *FRAME_HW), dtype=torch.uint8)
    methods = agent_methods(net)
    expected = {"gradcam", "occlusion", "rise", "intgrad", "aha"} | (
        {"gradskip", "rollout", "chefer"} if arch == "vit" else set())
    assert set(methods) == expected
    menu = {name: label for label, name in agent_method_choices()}  # the Agents tab's menu, from the registry
    assert set(methods) <= set(menu) and menu["aha"] == "AHA (per image)"
    assert {name for name, label in menu.items() if label.endswith("(ViT)")} == {"gradskip", "rollout", "chefer"}
    grad = explain_frames(net, frames, "gradcam", target="value")
    assert torch.allclose(grad, value_cam(net, frames)[0].detach(), atol=1e-5)  # class 0 of [V, 0] is V(s)
    for number, method in enumerate(methods):  # each method once, the two targets in turn
        target = ("value", "action")[number % 2]
        options_ = {"n_masks": 64} if method == "rise" else {}
        maps = explain_frames(net, frames, method, target=target, options=options_)
        assert maps.shape == (2, *FRAME_HW) and torch.isfinite(maps).all(), (method, target)


def test_no_pygame_needed_headless(monkeypatch):
    """The GPU machine had no pygame, which ViZDoom's Gymnasium wrapper imports (for windows only)."""
    import importlib.util
    import sys

    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pygame"
                        else real_find_spec(name, *a))
    monkeypatch.delitem(sys.modules, "pygame", raising=False)
    envs._allow_headless_wrapper()
    assert not hasattr(sys.modules["pygame"], "__file__")  # the empty stand-in
    monkeypatch.delitem(sys.modules, "pygame")


def test_iou_references_random_prior_and_ceiling():
    from explainers.agents.baselines import ceiling_maps, iou_references

    masks = np.zeros((6, *FRAME_HW), bool)
    for i in range(5):
        masks[i, 20:30, 8 * i:8 * i + 6] = True  # monsters; the last frame has none and is left out
    references = iou_references(masks, (15, 20), prior=masks[:5].mean(axis=0))
    assert len(references["random"]) == len(references["ceiling"]) == len(references["prior"]) == 5
    assert np.mean(references["random"]) < 0.1 < np.mean(references["prior"]) < np.mean(references["ceiling"])
    assert all(0.5 < c <= 1.0 for c in references["ceiling"])
    exact = torch.zeros(1, *FRAME_HW, dtype=torch.bool)
    exact[0, 20:32, 8:16] = True  # aligned with the 4 x 4 cells of a 15 x 20 grid: the ceiling is exact
    assert float(top_pixel_iou_of(ceiling_maps(exact, (15, 20)), exact)) == pytest.approx(1.0)


def top_pixel_iou_of(maps, masks):
    from explainers.metrics import top_pixel_iou

    return top_pixel_iou(maps, masks)[0]


def play_every_script(scenario: str, buttons: set, steps: int) -> list:
    """One short episode of each of the scenario's scripts (random, blind, aimed) from one held-out seed, after
    checking that the scenario's actions include `buttons`."""
    from explainers.agents.baselines import button_actions, play_scripted

    env = envs.make_env(scenario)
    try:
        assert set(button_actions(env)) >= buttons
        return [play_scripted(policy, scenario, 10_000_003, max_steps=steps, env=env, keep_masks=True)
                for policy in ("random", "blind", "aimed")]
    finally:
        env.close()


@needs_vizdoom
def test_scripted_policies_play_and_the_aimed_one_uses_the_mask():
    from explainers.agents.baselines import _aimed

    for record in play_every_script("defend_the_center", {"TURN_LEFT", "TURN_RIGHT", "ATTACK"}, steps=40):
        assert record["length"] == 40 and record["masks"].shape == (40, *FRAME_HW)
    mask = np.zeros(FRAME_HW, bool)
    mask[20:30, 60:66] = True
    assert _aimed(None, mask, 0, None, None) == "TURN_RIGHT"
    assert _aimed(None, np.fliplr(mask), 0, None, None) == "TURN_LEFT"
    mask[20:30, 38:42] = True
    assert _aimed(None, mask, 0, None, None) == "ATTACK"


def test_the_medkit_script_walks_to_the_nearest_medkit_and_each_scenario_has_its_own_scripts():
    """health_gathering's privileged script: the lowest medkit in the frame is the nearest on the floor; it turns
    toward it and walks when it is near the centre column; with none in sight it looks around. Scripts are per
    scenario: asking defend_the_center for a medkit script, or a scenario for a script it lacks, is refused."""
    from explainers.agents.baselines import SCRIPTS, _walk_to_medkit, script

    mask = np.zeros(FRAME_HW, bool)
    assert _walk_to_medkit(None, mask, 0, None, None) == "TURN_LEFT"
    mask[50:55, 70:74] = True  # right of centre, near
    mask[20:22, 10:12] = True  # left, far (higher in the frame)
    assert _walk_to_medkit(None, mask, 0, None, None) == "TURN_RIGHT"
    assert _walk_to_medkit(None, np.fliplr(mask), 0, None, None) == "TURN_LEFT"
    centred = np.zeros(FRAME_HW, bool)
    centred[50:55, 38:42] = True
    assert _walk_to_medkit(None, centred, 0, None, None) == "MOVE_FORWARD"
    assert {"random", "blind", "aimed"} <= set(SCRIPTS["health_gathering"]) and \
        {"random", "blind", "aimed"} <= set(SCRIPTS["defend_the_center"])
    walks = [script("health_gathering", "blind")(None, mask, step, None, None) for step in range(4)]
    assert set(walks) <= {"MOVE_FORWARD", "TURN_LEFT"} and "MOVE_FORWARD" in walks
    with pytest.raises(ValueError, match="No script 'forward-turn-2' for defend_the_center"):
        script("defend_the_center", "forward-turn-2")


@needs_vizdoom
def test_health_gathering_scripts_play_with_its_own_buttons():
    for record in play_every_script("health_gathering", {"TURN_LEFT", "TURN_RIGHT", "MOVE_FORWARD"}, steps=30):
        assert record["length"] == 30 and record["return"] > 0  # +1 a tic alive


@needs_vizdoom
def test_a_checkpoint_resumes_only_its_own_run_and_exports_a_snapshot(tmp_path):
    from explainers.agents.checkpoint import agent_from_checkpoint, load_agent
    from explainers.agents.train import train_agent

    train_agent(scenario_name="defend_the_center", out_dir=tmp_path, name="s", seed=3, steps=64,
                config=PPOConfig(**TINY), net_options=SMALL_NET)
    with pytest.raises(ValueError, match="another network"):
        train_agent(scenario_name="defend_the_center", out_dir=tmp_path, name="s", seed=3, steps=128,
                    config=PPOConfig(**TINY), net_options={"width": 16, "hidden": 32})
    with pytest.raises(ValueError, match=r"another PPO setting \(norm_every 1 there, 8 here\)"):
        train_agent(scenario_name="defend_the_center", out_dir=tmp_path, name="s", seed=3, steps=128,
                    config=PPOConfig(**{**TINY, "norm_every": 8}), net_options=SMALL_NET)
    card_path = agent_from_checkpoint(tmp_path / "s.ckpt", tmp_path, "s-snapshot")
    net, card = load_agent(card_path)
    final, _ = load_agent(tmp_path / "s.json")
    assert card["steps"] == 64 and card["snapshot_of"] == "s.ckpt"
    assert all(torch.equal(a, b) for a, b in zip(net.state_dict().values(), final.state_dict().values()))


def test_export_agent_halves_the_file_and_carries_the_held_out_evaluation(tmp_path):
    """export-agent: float16 weights (half the bytes), loaded back into the float32 network with the same policy
    and values within float16's precision, and the held-out summary (mean return, its interval, seeds, IoU) in the
    card, computed from that agent's episodes only."""
    import json

    from explainers.agents.checkpoint import load_agent, save_agent
    from explainers.cli import main
    from explainers.statistics import bootstrap_ci

    torch.manual_seed(0)
    net = build_network("nature", 4, frame_hw=(60, 80)).eval()
    save_agent(net, {"scenario": "defend_the_center", "steps": 4096, "lambda": 0.0}, tmp_path, "trained")
    returns = [3.0, 5.0, 9.0, 11.0]
    episodes = [{"agent": "trained", "seed": 1000 + k, "return": r, "iou": 0.1 * k} for k, r in enumerate(returns)]
    episodes.append({"agent": "other", "seed": 5, "return": 99.0, "iou": 0.9})  # another agent's: left out
    (tmp_path / "eval.json").write_text(json.dumps({"episodes": episodes, "greedy": False}))
    assert main(["export-agent", "--agent", str(tmp_path / "trained.json"), "--name", "shipped", "--half",
                 "--out-dir", str(tmp_path / "out"), "--evaluation", str(tmp_path / "eval.json")]) == 0
    full, half = tmp_path / "trained.safetensors", tmp_path / "out" / "shipped.safetensors"
    assert half.stat().st_size < 0.55 * full.stat().st_size
    shipped, card = load_agent(tmp_path / "out" / "shipped.json")
    assert card["stored_dtype"] == "float16" and card["exported_from"] == {"name": "trained", "steps": 4096}
    assert all(v.dtype == torch.float32 for v in shipped.state_dict().values() if v.is_floating_point())
    frames = torch.randint(0, 256, (3, 3, 60, 80), dtype=torch.uint8)
    with torch.no_grad():
        (logits_a, value_a), (logits_b, value_b) = net(frames)[:2], shipped(frames)[:2]
    assert torch.allclose(logits_a, logits_b, atol=1e-2) and torch.allclose(value_a, value_b, atol=1e-2)
    held = card["held_out"]
    assert held["mean_return"] == 7.0 and held["episodes"] == 4 and held["reset_seeds"] == [1000, 1003]
    assert held["ci95"] == [round(v, 3) for v in bootstrap_ci(returns)]
    assert held["value_cam_iou"]["mean"] == pytest.approx(0.15)


def test_export_agent_puts_greedy_play_and_what_needs_no_model_in_the_card(tmp_path):
    """With a sampled and a greedy evaluation and the scripted baselines of the same episodes, the card has both
    summaries, the scripts' returns and the IoU reference points averaged over this agent's own episodes (another
    agent's episodes left out), so the app can draw them beside the agent's figures."""
    import json

    from explainers.agents.checkpoint import load_agent, save_agent
    from explainers.cli import main

    net = build_network("nature", 4, frame_hw=(60, 80)).eval()
    save_agent(net, {"scenario": "defend_the_center", "steps": 4096, "lambda": 1.0}, tmp_path, "trained")

    def episode(agent, seed, ret, random_iou):
        return {"agent": agent, "seed": seed, "return": ret, "iou": 0.3,
                "iou_reference": {"random": random_iou, "prior": 0.1, "ceiling": None if seed == 2 else 0.5}}

    sampled = {"greedy": False, "episodes": [episode("trained", 1, 10.0, 0.01), episode("trained", 2, 12.0, 0.03),
                                            episode("other", 3, 99.0, 0.9)]}
    greedy = {"greedy": True, "episodes": [episode("trained", 1, 4.0, 0.01), episode("trained", 2, 6.0, 0.03)]}
    baselines = {"episode_seeds": [1, 2], "policies": {"random": {"return": {"mean": 0.5}},
                                                       "blind": {"return": {"mean": 3.5}}}}
    for name, record in (("s", sampled), ("g", greedy), ("b", baselines)):
        (tmp_path / f"{name}.json").write_text(json.dumps(record))
    assert main(["export-agent", "--agent", str(tmp_path / "trained.json"), "--name", "shipped", "--out-dir",
                 str(tmp_path / "out"), "--evaluation", str(tmp_path / "s.json"), str(tmp_path / "g.json"),
                 "--baselines", str(tmp_path / "b.json")]) == 0
    _, card = load_agent(tmp_path / "out" / "shipped.json")
    assert card["held_out"]["mean_return"] == 11.0 and not card["held_out"]["greedy"]
    assert card["held_out_greedy"]["mean_return"] == 5.0 and card["held_out_greedy"]["greedy"]
    references = card["references"]
    assert references["return"] == {"random": 0.5, "blind": 3.5} and references["return_episodes"] == [1, 2]
    assert references["iou"] == {"ceiling": 0.5, "prior": 0.1, "random": pytest.approx(0.02)}


def test_the_rebuilt_training_command_parses_back_to_the_cards_settings():
    """export-agent writes the train-agent command that makes the agent again from what its card records; parsed
    by the real command line it gives back the same scenario, seed, lambda, frame size, network and PPO settings."""
    import shlex

    from explainers.agents.cli import training_command
    from explainers.cli import build_parser

    card = {"scenario": "defend_the_center", "seed": 101, "lambda": 1.0, "steps": 196608, "frame_hw": [100, 156],
            "device": "cpu", "arch": {"arch": "nature", "hidden": 512},
            "ppo": {"num_envs": 2, "rollout_steps": 2048, "epochs": 3, "lr": 0.0001, "minibatch": 32, "clip": 0.2,
                    "entropy_coef": 0.0, "camal_max_grad_norm": 0.5, "cam_mode": "differentiable",
                    "norm_every": 8, "lr_schedule": "linear"}}
    command = training_command(card, "camal-s101")
    args = build_parser().parse_args(shlex.split(command.replace("python -m explainers ", "")))
    assert (args.scenario, args.seed, args.lam, args.steps, list(args.frame_hw)) == (
        "defend_the_center", 101, 1.0, 196608, [100, 156])
    assert (args.arch, args.hidden, args.num_envs, args.rollout_steps, args.epochs) == ("nature", 512, 2, 2048, 3)
    assert (args.lr, args.minibatch, args.clip, args.entropy_coef) == (0.0001, 32, 0.2, 0.0)
    assert (args.camal_max_grad_norm, args.cam_mode, args.name, args.threads) == (0.5, "differentiable",
                                                                                 "camal-s101", 1)
    assert args.camal_norm_every == 8 and args.lr_schedule == "linear"
