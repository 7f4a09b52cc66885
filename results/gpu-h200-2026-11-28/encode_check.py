"""Device check of branch tok: encode_pooled on CUDA (old per-batch copies at 64, new at 64, new by device) and the
token cache (cold, warm) on ArguAna with MiniLM."""
import statistics, tempfile, time, warnings
import numpy as np, torch
import biencoder
from biencoder.bench.common import compose_config
from biencoder.engine.data.corpus import run_splits
from biencoder.engine.machine.runtime import decide
from biencoder.engine.modeling.encoding import Encoding, eval_mode, encode_pooled, to_device
from biencoder.engine.modeling.model import build_model
from biencoder.engine.modeling.token_cache import TokenCache

print("biencoder from", biencoder.__file__)
cfg = compose_config(["data=arguana"])
_, splits = run_splits(cfg.data)
model, tok = build_model(cfg.model, progress=False)
rt = decide("auto", "auto")
model.to(rt.device)
import os
LIMIT = int(os.environ.get("LIMIT", "0"))
if LIMIT:
    from dataclasses import replace as _r
    splits = {n: _r(s, table=s.table.iloc[:LIMIT]) for n, s in splits.items()}
print(rt.device, rt.precision, rt.device_name, "torch", torch.__version__)
CUDA = rt.device.type == "cuda"
folder = tempfile.mkdtemp()
tokens = {}
for rep in ("cold", "warm"):
    cache = TokenCache(folder, tok, cfg.model.max_length)
    t = time.perf_counter()
    hits = []
    for n, s in splits.items():
        tokens[n], hit = cache.tokenized(s.texts, n)
        hits.append(hit)
    print(f"token cache {rep}: three splits in {time.perf_counter() - t:.2f} s, from the cache: {hits}")


def old(texts, encoding):
    order = np.argsort(-texts.lengths, kind="stable")
    device, bs, dtype = torch.device(encoding.device), encoding.batch_size, encoding.autocast_dtype
    pooled = []
    with eval_mode(model):
        for start in range(0, len(order), bs):
            batch = to_device(texts.batch(order[start : start + bs]), device, pin=CUDA)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                pooled.append(model.pool(**batch).float().cpu())
    return torch.cat(pooled)[torch.from_numpy(np.argsort(order))]


def sync():
    if CUDA:
        torch.cuda.synchronize()


def timed(fn):
    sync()
    t = time.perf_counter()
    out = fn()
    sync()
    return out, time.perf_counter() - t


dev, dt = rt.device, rt.autocast_dtype
print("by-device batch size:", Encoding(None, dev, dt).batch_size)
for name in splits:
    fns = {
        "old per-batch copy, 64": lambda: old(tokens[name], Encoding(64, dev, dt)),
        "new on device, 64": lambda: encode_pooled(model, tokens[name], Encoding(64, dev, dt)),
        "new on device, by device": lambda: encode_pooled(model, tokens[name], Encoding(None, dev, dt)),
    }
    outs = {}
    for label, fn in fns.items():
        fn()
        runs = [timed(fn) for _ in range(5)]
        outs[label] = runs[0][0]
        print(f"{name} ({len(tokens[name])} texts) {label}: median {1000 * statistics.median(r[1] for r in runs):.0f} ms "
              f"(min {1000 * min(r[1] for r in runs):.0f})")
    a, b, c = outs.values()
    cos = torch.nn.functional.cosine_similarity(b, c).min().item()
    print(f"  old==new at 64 bitwise: {torch.equal(a, b)}; 512 vs 64: max abs diff {(b - c).abs().max().item():.2e}, min cosine {cos:.6f}")
for label, fn in (("old 64", lambda: old(tokens["val"], Encoding(64, dev, dt))),
                  ("new by device", lambda: encode_pooled(model, tokens["val"], Encoding(None, dev, dt)))):
    if not CUDA:
        break
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("warn")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fn()
    torch.cuda.set_sync_debug_mode(0)
    kinds = sorted({str(w.message).split("\n")[0][:90] for w in caught})
    print(f"sync-debug warnings, encode val, {label}: {len(caught)} {kinds}")
