import copy
import math

import pytest
import torch

from biencoder.loss import TripletCELoss
from biencoder.model import Embeddings


def test_loss_parts_by_hand(tiny_model_and_tokenizer):
    model = copy.deepcopy(tiny_model_and_tokenizer[0])
    # sim: anchor at 0, positive at distance 1, negative at distance 0.5 → triplet = 1 - 0.5 + margin 1 = 1.5
    sim = lambda x: torch.tensor([[x] + [0.0] * 127])
    pooled = torch.zeros(1, 32)
    point, counter, negative = Embeddings(sim(0.0), pooled), Embeddings(sim(1.0), pooled), Embeddings(sim(0.5), pooled)
    # classifier: logits = [0, s_b[0]] so P(positive) = sigmoid(candidate's first sim coordinate)
    with torch.no_grad():
        model.out.weight.zero_(), model.out.bias.zero_()
        model.out.weight[1, 128] = 1.0  # features = [s_a, s_b, |s_a - s_b|, ...]; index 128 = s_b[0]
    out = TripletCELoss(margin=1.0, triplet_weight=2.0, ce_weight=0.5)(model, point, counter, negative)
    assert all(v.dim() == 0 and not v.requires_grad for v in out.parts.values())  # 0-d, detached: no host read
    parts = {k: v.item() for k, v in out.parts.items()}
    assert parts["triplet"] == pytest.approx(1.5, abs=1e-3)  # torch adds eps=1e-6 inside the distance
    ce_pos = -math.log(1 / (1 + math.exp(-1.0)))  # label 1, logit difference 1.0
    ce_neg = -math.log(1 - 1 / (1 + math.exp(-0.5)))  # label 0, logit difference 0.5
    assert parts["ce_pos"] == pytest.approx(ce_pos, rel=1e-5)
    assert parts["ce_neg"] == pytest.approx(ce_neg, rel=1e-5)
    assert parts["loss"] == pytest.approx(2.0 * parts["triplet"] + 0.5 * (ce_pos + ce_neg), rel=1e-5)
    assert out.features.shape[0] == 2 and out.head_input.shape == out.features.shape


def test_triplet_is_zero_when_negative_far_enough(tiny_model_and_tokenizer):
    model, _ = tiny_model_and_tokenizer
    pooled = torch.zeros(2, 32)
    a = Embeddings(torch.zeros(2, 128), pooled)
    p = Embeddings(torch.full((2, 128), 0.01), pooled)
    n = Embeddings(torch.full((2, 128), 1.0), pooled)
    assert TripletCELoss()(model, a, p, n).parts["triplet"].item() == 0.0


def test_loss_backpropagates_into_encoder_and_head(tiny_model_and_tokenizer):
    from biencoder.model import TokenizedTexts

    base, tokenizer = tiny_model_and_tokenizer
    model = copy.deepcopy(base)
    tokens = TokenizedTexts(["point text", "counter text", "negative text"], tokenizer, 16)
    emb = model.embed(**tokens.batch([0, 1, 2]))
    out = TripletCELoss()(model, emb.index([0]), emb.index([1]), emb.index([2]))
    out.total.backward()
    assert model.encoder.embeddings.word_embeddings.weight.grad.abs().sum() > 0
    assert model.out.weight.grad.abs().sum() > 0 and model.sim_head.weight.grad.abs().sum() > 0
