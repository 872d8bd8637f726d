#!/usr/bin/python3
"""Real models through uopd against PyTorch eager, measured in the same run.

Exports each model below with torch.onnx.export (random weights under a fixed seed, batch
1, typical input sizes), starts ONE uopd (a private one: loopback, ephemeral port, its own
cache directory under --workdir) and, for each model, alternates rounds of torch eager
(torch.set_num_threads(--torch-threads), default 2) and of `uop bench MODEL.onnx` against
that uopd, so both share the machine's noise. `uop bench` loads the model once per round
and runs it --warmup then --iterations times in one session; its load (import, weights
upload) is not part of the latency.

One row per model: torch p50 ms, uopd p50 ms, ratio_vs_torch (uopd / torch: below 1 uopd
is faster), and the largest absolute and relative error of uopd's outputs against torch's
for the same inputs (`uop run MODEL.onnx --in ... --out ...`; relative: max |uopd - torch|
over max |torch|, per output, the worst output). A model uopd refuses gets a row with the
status message and is left out of the geometric mean. torch p50 is the median of all its
timed runs; uopd p50 is the median of the rounds' p50s (min: the least of their mins).

Run by hand, never by CI or ctest: it needs PyTorch and torchvision (deploy/setup.sh
--bench) and a release build (`cmake --build --preset release --target uopd uop-worker
uop`). Examples:

  tests/bench/models/bench_models.py                        # every model
  tests/bench/models/bench_models.py --models resnet18,mlp --iterations 10 --rounds 3
  tests/bench/models/bench_models.py --json                 # one JSON object on stdout
  tests/bench/models/bench_models.py --profile              # then `uop run --profile` of the slowest
  tests/bench/models/bench_models.py --list

Exit status: 0 when every model that ran matched torch, 1 when one did not (a mismatch
is a bug), 2 usage.
"""
import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import time
import warnings

import numpy as np
import torch
import torchvision

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
OPSET = 17  # torch 1.13's newest: LayerNormalization is one op
SEED = 0


# ---------------------------------------------------------------------------------------
# The models: name -> (what it is, a builder returning (module, example inputs, input
# names, output names, dynamic axes)).


class TransformerEncoder(torch.nn.Module):
    """Two post-norm encoder layers (torch.nn.TransformerEncoderLayer), d_model 256,
    4 heads, feed-forward 1024, over a sequence of length T (dynamic)."""

    def __init__(self, d=256, heads=4, ff=1024, layers=2):
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True)
        self.encoder = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)

    def forward(self, x):
        return self.encoder(x)


class TransformerDecoder(torch.nn.Module):
    """A GPT-style decoder: token and position embeddings, two pre-norm causal
    self-attention layers (torch.nn.TransformerEncoderLayer with a causal mask made from
    the sequence length T, dynamic), a final LayerNorm and the vocabulary projection."""

    def __init__(self, vocab=2048, d=256, heads=4, ff=1024, layers=2, max_len=512):
        super().__init__()
        self.tok = torch.nn.Embedding(vocab, d)
        self.pos = torch.nn.Embedding(max_len, d)
        layer = torch.nn.TransformerEncoderLayer(d, heads, ff, dropout=0.0, batch_first=True, norm_first=True,
                                                 activation="gelu")
        self.blocks = torch.nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.norm = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, vocab, bias=False)

    def forward(self, ids):
        t = ids.shape[1]
        pos = torch.arange(t, device=ids.device)
        # float32 like the scores: torch.where of two Python floats exports as double.
        mask = torch.zeros(t, t).masked_fill(pos[None, :] > pos[:, None], float("-inf"))
        h = self.tok(ids) + self.pos(pos)[None]
        return self.head(self.norm(self.blocks(h, mask=mask)))


class Recurrent(torch.nn.Module):
    """An LSTM (64 -> 128) feeding a GRU (128 -> 128), batch_first, 32 steps, and a
    classifier on the last step."""

    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(64, 128, batch_first=True)
        self.gru = torch.nn.GRU(128, 128, batch_first=True)
        self.fc = torch.nn.Linear(128, 10)

    def forward(self, x):
        y, _ = self.lstm(x)
        y, _ = self.gru(y)
        return self.fc(y[:, -1])


def conv_block(cin, cout):
    return torch.nn.Sequential(
        torch.nn.Conv2d(cin, cout, 3, padding=1, bias=False), torch.nn.BatchNorm2d(cout), torch.nn.ReLU(inplace=True),
        torch.nn.Conv2d(cout, cout, 3, padding=1, bias=False), torch.nn.BatchNorm2d(cout), torch.nn.ReLU(inplace=True))


class UNet(torch.nn.Module):
    """A small U-Net on 128 x 128: two down steps (MaxPool), a bottleneck, one up step by
    ConvTranspose and one by bilinear Upsample (Resize), skip connections by Concat."""

    def __init__(self, c=16, classes=2):
        super().__init__()
        self.enc1, self.enc2, self.mid = conv_block(3, c), conv_block(c, 2 * c), conv_block(2 * c, 4 * c)
        self.pool = torch.nn.MaxPool2d(2)
        self.up1 = torch.nn.ConvTranspose2d(4 * c, 2 * c, 2, stride=2)
        self.dec1 = conv_block(4 * c, 2 * c)
        self.up2 = torch.nn.Sequential(torch.nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False),
                                       torch.nn.Conv2d(2 * c, c, 1))
        self.dec2 = conv_block(2 * c, c)
        self.head = torch.nn.Conv2d(c, classes, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(self.pool(e1))
        m = self.mid(self.pool(e2))
        d1 = self.dec1(torch.cat([self.up1(m), e2], 1))
        d2 = self.dec2(torch.cat([self.up2(d1), e1], 1))
        return self.head(d2)


class MLP(torch.nn.Module):
    """1024 -> 2048 -> 2048 -> 1000 with GELU and a LayerNorm, then softmax."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(1024, 2048), torch.nn.GELU(), torch.nn.LayerNorm(2048),
                                       torch.nn.Linear(2048, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 1000))

    def forward(self, x):
        return torch.softmax(self.net(x), -1)


def image(n=224):
    return torch.randn(1, 3, n, n)


def vision(fn):
    return lambda: (fn(), [image()], ["x"], ["y"], None)


MODELS = {
    "resnet18": ("torchvision resnet18, 1x3x224x224", vision(lambda: torchvision.models.resnet18())),
    "mobilenet_v2": ("torchvision mobilenet_v2 (depthwise), 1x3x224x224",
                     vision(lambda: torchvision.models.mobilenet_v2())),
    "squeezenet1_1": ("torchvision squeezenet1_1 (Concat, ceil-mode MaxPool), 1x3x224x224",
                      vision(lambda: torchvision.models.squeezenet1_1())),
    "shufflenet_v2": ("torchvision shufflenet_v2_x1_0 (channel shuffle, Split), 1x3x224x224",
                      vision(lambda: torchvision.models.shufflenet_v2_x1_0())),
    "transformer_encoder": ("2 encoder layers, d 256, 4 heads, seq 128 (dynamic)",
                            lambda: (TransformerEncoder(), [torch.randn(1, 128, 256)], ["x"], ["y"],
                                     {"x": {1: "seq"}, "y": {1: "seq"}})),
    "transformer_decoder": ("GPT-style causal decoder, 2 layers, d 256, vocab 2048, seq 64 (dynamic)",
                            lambda: (TransformerDecoder(), [torch.randint(0, 2048, (1, 64))], ["ids"], ["logits"],
                                     {"ids": {1: "seq"}, "logits": {1: "seq"}})),
    "lstm_gru": ("LSTM 64->128 then GRU 128->128, 32 steps", lambda: (Recurrent(), [torch.randn(1, 32, 64)], ["x"],
                                                                     ["y"], None)),
    "unet": ("U-Net, ConvTranspose + bilinear Upsample, 1x3x128x128",
             lambda: (UNet(), [image(128)], ["x"], ["y"], None)),
    "mlp": ("MLP 1024-2048-2048-1000, GELU, LayerNorm, softmax", lambda: (MLP(), [torch.randn(1, 1024)], ["x"], ["y"],
                                                                          None)),
}


# ---------------------------------------------------------------------------------------


def export(name, workdir):
    """Builds model `name` under the fixed seed, exports it and writes its inputs and
    torch's outputs as .npy. Returns (module, inputs, paths)."""
    torch.manual_seed(SEED)
    module, inputs, in_names, out_names, dynamic = MODELS[name][1]()
    module.eval()
    d = os.path.join(workdir, name)
    os.makedirs(d, exist_ok=True)
    onnx_path = os.path.join(d, "model.onnx")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's tracer notes on shapes and constants
        torch.onnx.export(module, tuple(inputs), onnx_path, input_names=in_names, output_names=out_names,
                          dynamic_axes=dynamic, opset_version=OPSET, do_constant_folding=True)
    in_files = []
    for n, t in zip(in_names, inputs):
        f = os.path.join(d, f"in_{n}.npy")
        np.save(f, t.numpy())
        in_files.append((n, f))
    with torch.no_grad():
        ref = module(*inputs)
    refs = [ref] if isinstance(ref, torch.Tensor) else list(ref)
    ref_files = []
    for n, t in zip(out_names, refs):
        f = os.path.join(d, f"ref_{n}.npy")
        np.save(f, t.numpy())
        ref_files.append((n, f))
    return module, inputs, {"dir": d, "onnx": onnx_path, "in": in_files, "ref": ref_files}


def torch_round(module, inputs, warmup, iterations):
    with torch.no_grad():
        for _ in range(warmup):
            module(*inputs)
        out = []
        for _ in range(iterations):
            t0 = time.perf_counter()
            module(*inputs)
            out.append((time.perf_counter() - t0) * 1e3)
    return out


class Uopd:
    """One uopd for the whole run: loopback, an ephemeral port, no metrics port, its own
    disk cache (kept under the work directory, so a rerun compiles nothing)."""

    def __init__(self, build, workdir, deadline_s):
        self.log = open(os.path.join(workdir, "uopd.log"), "w")
        cmd = [os.path.join(build, "server", "uopd"), "--listen=127.0.0.1:0", "--metrics-listen=",
               f"--cache-dir={os.path.join(workdir, 'cache')}", f"--request-deadline-s={deadline_s}"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self.log, text=True)
        self.address = None
        for line in self.proc.stdout:
            m = re.match(r"LISTENING (\S+)", line)
            if m:
                self.address = m.group(1)
                break
        if not self.address:
            self.proc.wait()
            raise RuntimeError(f"uopd did not start (exit {self.proc.returncode}); see {self.log.name}")

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def uop(args, build, server, deadline_s, timeout_s):
    cmd = [os.path.join(build, "client", "uop"), *args, f"--server={server}", f"--deadline={deadline_s}"]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as e:
        return subprocess.CompletedProcess(cmd, 124, e.stdout or "", f"timed out after {timeout_s} s")


def refusal(proc):
    """The status message of a failed uop command (its last line on stderr)."""
    lines = [l for l in (proc.stderr or "").strip().splitlines() if l.strip()]
    msg = lines[-1] if lines else f"exit {proc.returncode}"
    return re.sub(r"^uop: (\S+\.onnx: )?", "", msg)


def in_flags(paths):
    return [x for n, f in paths["in"] for x in ("--in", f"{n}={f}")]


def compare(paths, build, server, deadline_s, timeout_s):
    """uopd's outputs for the model's inputs against torch's: (max abs, max rel, error)."""
    outs = [(n, os.path.join(paths["dir"], f"uopd_{n}.npy")) for n, _ in paths["ref"]]
    p = uop(["run", paths["onnx"], *in_flags(paths), *[x for n, f in outs for x in ("--out", f"{n}={f}")]], build,
            server, deadline_s, timeout_s)
    if p.returncode != 0:
        return None, None, refusal(p)
    worst_abs, worst_rel = 0.0, 0.0
    for (n, got_f), (_, ref_f) in zip(outs, paths["ref"]):
        got, ref = np.load(got_f).astype(np.float64), np.load(ref_f).astype(np.float64)
        if got.shape != ref.shape:
            return None, None, f"output {n}: shape {got.shape}, torch's is {ref.shape}"
        err = float(np.max(np.abs(got - ref))) if ref.size else 0.0
        if not math.isfinite(err):
            err = math.inf
        scale = float(np.max(np.abs(ref))) if ref.size else 0.0
        worst_abs = max(worst_abs, err)
        worst_rel = max(worst_rel, err / scale if scale > 0 else err)
    return worst_abs, worst_rel, None


def median(v):
    s = sorted(v)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


def bench_model(name, args, server, exported):
    row = {"model": name, "what": MODELS[name][0]}
    try:
        module, inputs, paths = export(name, args.workdir)
    except Exception as e:  # an export failure is torch's, not uopd's: say so and go on
        row["error"] = f"torch.onnx.export failed: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        return row
    exported[name] = paths
    torch_ms, uopd_p50s, uopd_mins, reports = [], [], [], []
    for _ in range(args.rounds):
        torch_ms += torch_round(module, inputs, args.warmup, args.iterations)
        p = uop(["bench", paths["onnx"], *in_flags(paths), "--json", "--iterations", str(args.iterations), "--warmup",
                 str(args.warmup)], args.build, server, args.deadline, args.timeout)
        if p.returncode != 0:
            row["refused"] = refusal(p)
            break
        r = json.loads(p.stdout)
        uopd_p50s.append(r["p50_ms"])
        uopd_mins.append(r["min_ms"])
        reports.append(r)
    row["torch_p50_ms"] = median(torch_ms)
    row["torch_min_ms"] = min(torch_ms)
    if "refused" in row:
        return row
    row["uopd_p50_ms"] = median(uopd_p50s)
    row["uopd_min_ms"] = min(uopd_mins)
    row["uopd_load_ms"] = median([r["load_ms"] for r in reports])
    for k in ("mean_plan_ms", "mean_compile_ms", "mean_run_ms", "mean_client_ms"):
        row["uopd_" + k] = median([r[k] for r in reports])
    row["ratio_vs_torch"] = row["uopd_p50_ms"] / row["torch_p50_ms"]
    abs_err, rel_err, err = compare(paths, args.build, server, args.deadline, args.timeout)
    if err:
        row["mismatch"] = f"uop run failed: {err}"
    else:
        row["max_abs_err"], row["max_rel_err"] = abs_err, rel_err
        if not rel_err <= args.rtol:
            row["mismatch"] = f"max relative error {rel_err:.3g} over {args.rtol:g}"
    return row


def table(rows, geomean, excluded):
    head = ["model", "torch p50 ms", "uopd p50 ms", "ratio_vs_torch", "torch min ms", "uopd min ms", "max abs err",
            "max rel err", "note"]
    lines = [head]
    for r in rows:
        note = r.get("error") or (f"refused: {r['refused']}" if "refused" in r else r.get("mismatch", ""))
        f = lambda k, fmt: fmt.format(r[k]) if k in r else "-"
        lines.append([r["model"], f("torch_p50_ms", "{:.3f}"), f("uopd_p50_ms", "{:.3f}"), f("ratio_vs_torch", "{:.3f}"),
                      f("torch_min_ms", "{:.3f}"), f("uopd_min_ms", "{:.3f}"), f("max_abs_err", "{:.2e}"),
                      f("max_rel_err", "{:.2e}"), note])
    width = [max(len(l[i]) for l in lines) for i in range(len(head) - 1)]
    out = []
    for l in lines:
        cells = [l[0].ljust(width[0])] + [l[i].rjust(width[i]) for i in range(1, len(width))]
        out.append("  ".join(cells + [l[-1]]).rstrip())
    out.append("geomean ratio_vs_torch: " + (f"{geomean:.2f}" if geomean else "-") +
               (f" (left out: {', '.join(excluded)})" if excluded else ""))
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--models", help="comma-separated names (default: all; --list names them)")
    ap.add_argument("--list", action="store_true", help="name the models and exit")
    ap.add_argument("--iterations", type=int, default=5, help="timed runs per round, each side (default 5)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed runs per round, each side (default 2)")
    ap.add_argument("--rounds", type=int, default=2, help="alternating torch / uopd rounds per model (default 2)")
    ap.add_argument("--torch-threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "release"), help="the build tree (default: release)")
    ap.add_argument("--server", help="HOST:PORT of a running uopd to use instead of starting one")
    ap.add_argument("--workdir", help="models, inputs, outputs, uopd's cache and log (default: a new temporary one)")
    ap.add_argument("--deadline", type=float, default=3600, help="seconds for each uopd request (default 3600)")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds for each uop command (default 3600)")
    ap.add_argument("--rtol", type=float, default=1e-3, help="largest max relative error that matches (default 1e-3)")
    ap.add_argument("--json", action="store_true", help="one JSON object on stdout instead of the table")
    ap.add_argument("--profile", nargs="?", const="", metavar="MODEL",
                    help="after the table, `uop run MODEL.onnx --profile` (default: the slowest by uopd p50)")
    args = ap.parse_args()
    if args.list:
        for n, (what, _) in MODELS.items():
            print(f"{n:20} {what}")
        return 0
    names = list(MODELS) if not args.models else [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        print(f"bench_models: unknown model(s) {', '.join(unknown)}; --list names them", file=sys.stderr)
        return 2
    if args.profile and args.profile not in names:
        print(f"bench_models: --profile {args.profile} is not among the models benchmarked", file=sys.stderr)
        return 2
    if min(args.iterations, args.rounds) < 1 or args.warmup < 0:
        print("bench_models: --iterations and --rounds must be at least 1, --warmup at least 0", file=sys.stderr)
        return 2
    for tool in ("server/uopd", "client/uop", "worker/uop-worker"):
        if not args.server or tool == "client/uop":
            if not os.access(os.path.join(args.build, tool), os.X_OK):
                print(f"bench_models: {os.path.join(args.build, tool)} is missing: build it (release preset)",
                      file=sys.stderr)
                return 2
    args.workdir = args.workdir or tempfile.mkdtemp(prefix="uopd-bench-models-")
    os.makedirs(args.workdir, exist_ok=True)
    torch.set_num_threads(args.torch_threads)
    log = lambda m: print(m, file=sys.stderr, flush=True)
    log(f"bench_models: work directory {args.workdir}; torch {torch.__version__} with {args.torch_threads} threads; "
        f"{args.rounds} rounds x ({args.warmup} warm-up + {args.iterations} timed) per side")
    server = None
    if args.server:
        address = args.server
    else:
        server = Uopd(args.build, args.workdir, int(args.deadline))
        address = server.address
    rows, profile_text, exported = [], None, {}
    try:
        for n in names:
            t0 = time.time()
            row = bench_model(n, args, address, exported)
            rows.append(row)
            log(f"  {n}: {json.dumps({k: v for k, v in row.items() if k != 'what'})} ({time.time() - t0:.0f} s)")
        timed = [r for r in rows if "ratio_vs_torch" in r]
        if args.profile is not None and timed:
            pick = args.profile or max(timed, key=lambda r: r["uopd_p50_ms"])["model"]
            paths = exported[pick]
            # The outputs to files, so that stdout is the table alone.
            outs = [x for n, _ in paths["ref"] for x in ("--out", f"{n}={os.path.join(paths['dir'], f'profiled_{n}.npy')}")]
            p = uop(["run", paths["onnx"], *in_flags(paths), *outs, "--profile"], args.build, address, args.deadline,
                    args.timeout)
            profile_text = f"uop run {pick}/model.onnx --in ... --profile\n" + p.stdout.rstrip() + \
                ("" if p.returncode == 0 else f"\nfailed: {refusal(p)}")
    finally:
        if server:
            server.stop()
    timed = [r for r in rows if "ratio_vs_torch" in r]
    excluded = [r["model"] for r in rows if "ratio_vs_torch" not in r]
    geomean = math.exp(sum(math.log(r["ratio_vs_torch"]) for r in timed) / len(timed)) if timed else None
    if args.json:
        print(json.dumps({"torch": torch.__version__, "torch_threads": args.torch_threads, "rounds": args.rounds,
                          "warmup": args.warmup, "iterations": args.iterations, "models": rows,
                          "geomean_ratio_vs_torch": geomean, "left_out_of_geomean": excluded,
                          "profile": profile_text}, indent=1))
    else:
        print(table(rows, geomean, excluded))
        if profile_text:
            print("\n" + profile_text)
    return 1 if any("mismatch" in r for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
