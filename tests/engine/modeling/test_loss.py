import copy
import math

import pytest
import torch

from biencoder.engine.modeling.loss import InfoNCELoss, TripletCELoss, same_text_mask
from biencoder.engine.modeling.model import Embeddings


def test_loss_parts_by_hand(tiny_model_and_tokenizer):
    model = copy.deepcopy(tiny_model_and_tokenizer[0])
    # sim: anchor at 0, positive at distance 1, negative at distance 0.5 → triplet = 1 - 0.5 + margin 1 = 1.5

    def sim(x):
        return torch.tensor([[x] + [0.0] * 127])

    pooled = torch.zeros(1, 32)
    point, counter, negative = Embeddings(sim(0.0), pooled), Embeddings(sim(1.0), pooled), Embeddings(sim(0.5), pooled)
    # classifier: logits = [0, s_b[0]] so P(positive) = sigmoid(candidate's first sim coordinate)
    with torch.no_grad():
        model.head.out.weight.zero_(), model.head.out.bias.zero_()
        model.head.out.weight[1, 128] = 1.0  # features = [s_a, s_b, |s_a - s_b|, ...]; index 128 = s_b[0]
    out = TripletCELoss(margin=1.0, triplet_weight=2.0, ce_weight=0.5)(model, point, counter, negative)
    assert all(v.dim() == 0 and not v.requires_grad for v in out.parts.values())  # 0-d, detached: no host read
    parts = {k: v.item() for k, v in out.parts.items()}
    assert parts["triplet"] == pytest.approx(1.5, abs=1e-3)  # torch adds eps=1e-6 inside the distance
    ce_pos = -math.log(1 / (1 + math.exp(-1.0)))  # label 1, logit difference 1.0
    ce_neg = -math.log(1 - 1 / (1 + math.exp(-0.5)))  # label 0, logit difference 0.5
    assert parts["ce_pos"] == pytest.approx(ce_pos, rel=1e-5)
    assert parts["ce_neg"] == pytest.approx(ce_neg, rel=1e-5)
    assert parts["loss"] == pytest.approx(2.0 * parts["triplet"] + 0.5 * (ce_pos + ce_neg), rel=1e-5)
    assert out.head_pre.shape[0] == 2 and out.head_post.shape == out.head_pre.shape


def test_triplet_is_zero_when_negative_far_enough(tiny_model_and_tokenizer):
    model, _ = tiny_model_and_tokenizer
    pooled = torch.zeros(2, 32)
    a = Embeddings(torch.zeros(2, 128), pooled)
    p = Embeddings(torch.full((2, 128), 0.01), pooled)
    n = Embeddings(torch.full((2, 128), 1.0), pooled)
    assert TripletCELoss()(model, a, p, n).parts["triplet"].item() == 0.0


def test_loss_backpropagates_into_encoder_and_head(tiny_model_and_tokenizer):
    from biencoder.engine.modeling.encoding import TokenizedTexts

    base, tokenizer = tiny_model_and_tokenizer
    model = copy.deepcopy(base)
    tokens = TokenizedTexts(["point text", "counter text", "negative text"], tokenizer, 16)
    emb = model.embed(**tokens.batch([0, 1, 2]))
    out = TripletCELoss()(model, emb.index([0]), emb.index([1]), emb.index([2]))
    out.total.backward()
    assert model.encoder.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    assert model.head.out.weight.grad.abs().sum() > 0 and model.sim_head.weight.grad.abs().sum() > 0


# -- InfoNCE (in-batch + mined negatives) -------------------------------------------------------------------------
E = torch.eye(3)


def test_infonce_equals_the_hand_computed_value():
    # queries e0, e1, e2; their counters e0, e1, e2; mined negatives e1, e2, e0. Candidates of query i:
    # [c0, c1, c2, n0, n1, n2]; cos(q_i, ·) is 1 for its own counter and for the one negative equal to e_i, 0
    # for the four others. Per query: -s + log(2 e^s + 4), the same for all three by symmetry.
    loss = InfoNCELoss(scale=1.0)
    text_id = torch.arange(9).view(3, 3)  # all texts distinct: nothing masked
    scores, target, masked = loss.scores(E, E, E[[1, 2, 0]], text_id)
    assert target.tolist() == [0, 1, 2] and not masked.any()
    assert scores.tolist() == [[1, 0, 0, 0, 0, 1], [0, 1, 0, 1, 0, 0], [0, 0, 1, 0, 1, 0]]
    value = torch.nn.functional.cross_entropy(scores, target).item()
    assert value == pytest.approx(-1.0 + math.log(2 * math.e + 4), rel=1e-6)
    # scale multiplies the cosines: with s = 2 the mined negative e0 of query 2 (row 2) still scores as high as c0
    scores2, _, _ = InfoNCELoss(scale=2.0).scores(E, E, E[[1, 2, 0]], text_id)
    assert torch.nn.functional.cross_entropy(scores2, target).item() == pytest.approx(
        -2.0 + math.log(2 * math.e**2 + 4), rel=1e-6
    )


def floats(parts: dict) -> dict[str, float]:
    """LossOutput.parts (detached 0-d tensors) as Python floats."""
    return {k: float(v) for k, v in parts.items()}


def test_infonce_total_adds_the_weighted_pair_cross_entropy(tiny_model_and_tokenizer):
    model = copy.deepcopy(tiny_model_and_tokenizer[0])
    torch.manual_seed(0)
    emb = [Embeddings(torch.randn(3, 128), torch.randn(3, 32)) for _ in range(3)]
    text_id = torch.arange(9).view(3, 3)
    out = floats(InfoNCELoss(scale=20.0, ce_weight=0.5)(model, *emb, text_id=text_id).parts)
    assert out["loss"] == pytest.approx(out["infonce"] + 0.5 * (out["ce_pos"] + out["ce_neg"]), rel=1e-5)
    triplet = floats(TripletCELoss()(model, *emb).parts)  # the same pair classifier terms as the triplet loss
    assert out["ce_pos"] == triplet["ce_pos"] and out["ce_neg"] == triplet["ce_neg"]
    only = floats(InfoNCELoss(scale=20.0, ce_weight=0.0)(model, *emb, text_id=text_id).parts)
    assert only["loss"] == pytest.approx(only["infonce"], rel=1e-6)


def test_a_duplicate_of_the_positive_is_never_scored_as_a_negative():
    # planted: the counter of query 1 has the same text (id 10) as the counter of query 0; the mined negative of
    # query 2 too; the counter of query 2 has the text of point 0 (id 0). For query 0 all three must be masked,
    # and the loss must equal the one computed with those candidates removed.
    torch.manual_seed(1)
    point, counter, negative = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4)
    text_id = torch.tensor([[0, 1, 2], [10, 10, 0], [20, 21, 10]])
    loss = InfoNCELoss(scale=5.0)
    scores, target, masked = loss.scores(point, counter, negative, text_id)
    assert masked[0].tolist() == [False, True, True, False, False, True]  # c1, c2 (its own point), n2
    # query 1's positive (text 10) is c0's text too, and n2's; its own column (c1) stays
    assert masked[1].tolist() == [True, False, False, False, False, True]
    assert masked[2].tolist() == [False, False, False, False, False, False]
    assert torch.isinf(scores[masked]).all() and torch.isfinite(scores[~masked]).all()
    # no candidate with the positive's text ever keeps a finite score, except the positive itself
    candidate_text = torch.cat([text_id[1], text_id[2]])
    for i in range(3):
        same = candidate_text == text_id[1, i]
        same[target[i]] = False
        assert torch.isinf(scores[i, same]).all()
    keep = ~masked[0]
    kept = (
        5.0
        * torch.nn.functional.normalize(point[:1], dim=-1)
        @ torch.nn.functional.normalize(torch.cat([counter, negative])[keep], dim=-1).T
    )
    by_hand = -kept[0, 0] + torch.logsumexp(kept[0], 0)
    per_query = torch.nn.functional.cross_entropy(scores, target, reduction="none")
    assert per_query[0].item() == pytest.approx(by_hand.item(), rel=1e-5)


def test_same_text_mask_keeps_the_target():
    mask = same_text_mask(torch.tensor([5]), torch.tensor([7]), torch.tensor([7, 7, 5, 6]), torch.tensor([1]))
    assert mask.tolist() == [[True, False, True, False]]


def test_ddp_shared_negatives_equal_the_local_ones_with_one_process(tmp_path):
    """A 1-process gloo group: the gathered candidates (with gradients) are the local ones, so the loss and its
    gradients are equal; without the group the gather is skipped altogether."""
    import torch.distributed as dist

    torch.manual_seed(2)
    point, counter, negative = (torch.randn(4, 8, requires_grad=True) for _ in range(3))
    text_id = torch.tensor([[0, 1, 2, 3], [4, 5, 4, 6], [7, 8, 9, 5]])  # a duplicate counter text (4) too

    def loss_and_grads(gather):
        for t in (point, counter, negative):
            t.grad = None
        scores, target, _ = InfoNCELoss(scale=10.0, gather=gather).scores(point, counter, negative, text_id)
        value = torch.nn.functional.cross_entropy(scores, target)
        value.backward()
        return value.detach(), [t.grad.clone() for t in (point, counter, negative)]

    local, local_grads = loss_and_grads(False)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=0, world_size=1)
    try:
        shared, shared_grads = loss_and_grads(True)
    finally:
        dist.destroy_process_group()
    assert torch.equal(shared, local)
    for a, b in zip(shared_grads, local_grads, strict=True):
        assert torch.allclose(a, b, atol=1e-7)
    assert any(g.abs().sum() > 0 for g in shared_grads[1:])  # the gradient reached the gathered candidates


def _two_rank_infonce(rank: int, world: int, rendezvous: str, out: str) -> None:
    """One rank of :func:`test_gathered_negatives_across_two_processes`: its own 3 queries' loss with gather=True."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        point, counter, negative = (torch.randn(world * 3, 8) for _ in range(3))
        own = [t[rank * 3 : (rank + 1) * 3].clone().requires_grad_() for t in (point, counter, negative)]
        text_id = torch.arange(3 * world * 3).view(3, world * 3)[:, rank * 3 : (rank + 1) * 3]
        scores, target, _ = InfoNCELoss(scale=5.0, gather=True).scores(*own, text_id)
        loss = torch.nn.functional.cross_entropy(scores, target)
        loss.backward()
        torch.save({"loss": loss.detach(), "grads": [t.grad for t in own]}, out)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_gathered_negatives_across_two_processes(tmp_path):
    """Two gloo processes, 3 queries each: each rank's loss equals the single-process loss of its queries against
    all 12 candidates, and each rank's rows get the gradient of the *sum* of both ranks' losses (what DDP then
    averages), as when one process computes everything."""
    import torch.multiprocessing as mp

    world = 2
    mp.spawn(_worker_entry, args=(world, str(tmp_path / "rendezvous"), str(tmp_path)), nprocs=world)
    torch.manual_seed(0)
    point, counter, negative = (torch.randn(world * 3, 8, requires_grad=True) for _ in range(3))
    candidates = torch.nn.functional.normalize(torch.cat([counter, negative]), dim=-1)
    scores = 5.0 * torch.nn.functional.normalize(point, dim=-1) @ candidates.T
    per_query = torch.nn.functional.cross_entropy(scores, torch.arange(world * 3), reduction="none")
    total = sum(per_query[r * 3 : (r + 1) * 3].mean() for r in range(world))
    total.backward()
    for rank in range(world):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert torch.allclose(got["loss"], per_query[rank * 3 : (rank + 1) * 3].mean().detach(), atol=1e-6)
        for mine, full in zip(got["grads"], (point, counter, negative), strict=False):
            assert torch.allclose(mine, full.grad[rank * 3 : (rank + 1) * 3], atol=1e-6)


def _worker_entry(rank: int, world: int, rendezvous: str, folder: str) -> None:
    _two_rank_infonce(rank, world, rendezvous, f"{folder}/rank{rank}.pt")


def test_infonce_scores_and_softmax_are_fp32_under_autocast(tiny_model_and_tokenizer):
    """CPU autocast casts matmuls to bf16 as a GPU's does: the InfoNCE term and its gradients with respect to the sim
    vectors must equal an fp32 computation to ~1e-6, though bf16 would be off by ~1e-3 (loss) and ~1e-2 (gradients).
    ce_weight=0 keeps the classifier's terms (which do run in bf16 here) out of the comparison."""
    model = copy.deepcopy(tiny_model_and_tokenizer[0])
    torch.manual_seed(3)
    sims = [torch.randn(16, 128) for _ in range(3)]
    pooled = [torch.randn(16, 32) for _ in range(3)]
    text_id = torch.arange(48).view(3, 16)
    loss = InfoNCELoss(scale=20.0, ce_weight=0.0)

    def infonce_and_grads(autocast: bool):
        leaves = [s.clone().requires_grad_() for s in sims]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = loss(model, *(Embeddings(s, p) for s, p in zip(leaves, pooled, strict=True)), text_id=text_id)
            scores, _, _ = loss.scores(*leaves, text_id)
        out.total.backward()
        return out.parts["infonce"], scores, [leaf.grad for leaf in leaves]

    ref_loss, ref_scores, ref_grads = infonce_and_grads(False)
    amp_loss, amp_scores, amp_grads = infonce_and_grads(True)
    assert amp_loss.item() == pytest.approx(ref_loss.item(), rel=1e-6)  # bf16 scores: 3e-5 off
    for amp, ref in zip(amp_grads, ref_grads, strict=True):
        assert ref.abs().max() > 1e-3  # every input gets a gradient worth comparing
        torch.testing.assert_close(amp, ref, rtol=1e-6, atol=1e-7)  # bf16 scores: 8e-3 of the largest off
    torch.testing.assert_close(amp_scores, ref_scores, rtol=1e-6, atol=1e-6)
    assert amp_scores.dtype == torch.float32


@pytest.mark.parametrize("name", ["triplet_ce", "infonce"])
def test_what_a_loss_returns_besides_its_value(tiny_model_and_tokenizer, name):
    """The total to backpropagate is the logged loss; features and head input (the head statistics of
    metrics.jsonl) are the classifier's on (point, counter) then (point, negative); InfoNCE's ``masked`` is the
    candidates masked per query, a mean over the queries."""
    model = copy.deepcopy(tiny_model_and_tokenizer[0])
    torch.manual_seed(0)
    point, counter, negative = (
        Embeddings(torch.randn(3, 128, requires_grad=True), torch.randn(3, 32)) for _ in range(3)
    )
    # candidates' texts [c0 c1 c2 n0 n1 n2] = [10 10 11 20 21 10]. Query 0 (counter text 10): c1 and n2 masked;
    # query 1 (10): c0 and n2; query 2 (11): none. 4 in all, 4/3 per query
    text_id = torch.tensor([[0, 1, 2], [10, 10, 11], [20, 21, 10]])
    loss = TripletCELoss() if name == "triplet_ce" else InfoNCELoss(scale=20.0)
    out = loss(model, point, counter, negative, text_id=text_id)
    assert out.total.requires_grad and out.total.item() == out.parts["loss"].item()
    features = model.head.pair_features(
        Embeddings(torch.cat([point.sim, point.sim]), torch.cat([point.pooled, point.pooled])),
        Embeddings(torch.cat([counter.sim, negative.sim]), torch.cat([counter.pooled, negative.pooled])),
    )
    torch.testing.assert_close(out.head_pre, features)
    torch.testing.assert_close(out.head_post, model.head(features)[1])
    if name == "infonce":
        assert set(out.parts) == {"loss", "infonce", "ce_pos", "ce_neg", "masked"}
        assert out.parts["masked"].item() == pytest.approx(4 / 3)
    else:
        assert set(out.parts) == {"loss", "triplet", "ce_pos", "ce_neg"}


def test_gather_without_a_process_group_is_the_local_loss():
    """loss.gather=true in a single process (no torchrun): nothing to gather, the same scores as gather=false."""
    torch.manual_seed(3)
    point, counter, negative = torch.randn(3, 4), torch.randn(3, 4), torch.randn(3, 4)
    text_id = torch.arange(9).view(3, 3)
    local = InfoNCELoss(scale=5.0).scores(point, counter, negative, text_id)
    gathered = InfoNCELoss(scale=5.0, gather=True).scores(point, counter, negative, text_id)
    for a, b in zip(local, gathered, strict=True):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_each_losss_own_defaults_are_the_schemas():
    """A loss built without the config (TripletCELoss() in a script) computes what the default config does: each
    keyword it reads from ``loss.*`` defaults to the schema's value."""
    from biencoder.engine.modeling.loss import build_loss
    from conftest import compose_cfg

    own, configured = TripletCELoss(), build_loss(compose_cfg([]).loss)
    assert (own.triplet.margin, own.triplet.p, own.triplet_weight, own.ce_weight) == (
        configured.triplet.margin,
        configured.triplet.p,
        configured.triplet_weight,
        configured.ce_weight,
    )
    own, configured = InfoNCELoss(), build_loss(compose_cfg(["loss=infonce"]).loss)
    assert (own.scale, own.ce_weight, own.gather) == (configured.scale, configured.ce_weight, configured.gather)


def test_triplet_margin_and_euclidean_distance_by_hand(tiny_model_and_tokenizer):
    """loss.margin reaches the triplet term, on Euclidean (p=2) distances of vectors with two non-zero coordinates:
    d(a, p) = |(3, 4)| = 5, d(a, n) = 4.9, so triplet = 5 − 4.9 + margin."""
    model, _ = tiny_model_and_tokenizer

    def sim(*x):
        return torch.tensor([list(x) + [0.0] * (128 - len(x))])

    pooled = torch.zeros(1, 32)
    point, counter, negative = (Embeddings(sim(*x), pooled) for x in ((0.0,), (3.0, 4.0), (0.0, 4.9)))
    for margin in (0.25, 1.0):
        triplet = TripletCELoss(margin=margin)(model, point, counter, negative).parts["triplet"].item()
        assert triplet == pytest.approx(0.1 + margin, abs=1e-4)  # torch adds eps=1e-6 inside the distance


@pytest.mark.slow
def test_build_loss_reads_the_keys_of_the_chosen_loss():
    from biencoder.engine.modeling.loss import build_loss
    from conftest import compose_cfg

    triplet = build_loss(compose_cfg(["loss.margin=0.5", "loss.triplet_weight=2", "loss.ce_weight=0.25"]).loss)
    assert isinstance(triplet, TripletCELoss) and triplet.triplet.margin == 0.5
    assert (triplet.triplet_weight, triplet.ce_weight) == (2.0, 0.25)
    infonce = build_loss(compose_cfg(["loss=infonce", "loss.scale=10", "loss.ce_weight=0", "loss.gather=true"]).loss)
    assert isinstance(infonce, InfoNCELoss) and (infonce.scale, infonce.ce_weight, infonce.gather) == (10.0, 0.0, True)


def test_infonce_without_text_ids_is_refused(tiny_model_and_tokenizer):
    emb = Embeddings(torch.zeros(2, 128), torch.zeros(2, 32))
    with pytest.raises(ValueError, match=r"^InfoNCELoss needs the text ids of the batch \(duplicate texts must be"):
        InfoNCELoss()(tiny_model_and_tokenizer[0], emb, emb, emb)
