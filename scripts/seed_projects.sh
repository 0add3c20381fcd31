#!/usr/bin/env bash
# make test-seed-projects: the seeds' own projects, as they ship on PyPI, on distmesh beside
# Gloo (issue 51). Not part of `make test` (about 20 minutes on 2 cores, environments made).
#
#   Optimus-DL 0.2.6  its own multi-process tests (tests/model/test_tp*.py and
#                     tests/integration/test_stateful_evaluation.py of its sdist: 41 tests, each
#                     spawning 2 ranks that hard-code "gloo"), run once as they are and once
#                     with DISTMESH_REPLACE_GLOO=1, outcomes compared per test; and a tiny
#                     training run of its own recipe (scripts/train.py, its
#                     train_llama_shakespeare.yaml made small: 2 layers, 6 steps of DDP, on a
#                     local text, checkpoints at steps 3 and 6) under torchrun, 2 ranks, the
#                     same two ways: every step's loss, grad norm and accuracy and the
#                     checkpoints' tensor shards must be bit-equal. Then the recipe with
#                     distmesh's own Collective in place of its MeshCollective (made from the
#                     launcher's environment, torch's default group, taken by its transforms as
#                     a MeshCollective): DDP and FSDP2 (its fully_shard transform), each against
#                     its Gloo run, the same way.
#
#   LLaMA-Factory 0.9.5  its v1 SFT trainer (python -m llamafactory.v1.trainers.sft_trainer)
#                     with its FSDP2 engine and activation checkpointing, 2 ranks under
#                     torchrun, 4 steps, on a tiny LlamaConfig model with a word-level tokenizer
#                     and a chat dataset made here (no hub access), the same two ways: every
#                     step's loss and grad norm and the saved model's bytes must be equal. Its
#                     helper.synchronize calls torch.accelerator.synchronize(), which raises
#                     without an accelerator: a sitecustomize.py on both runs' PYTHONPATH makes
#                     that a no-op on CPU.
#
# Each project gets its own virtual environment under $SEED_CACHE (default
# ~/.cache/distmesh/seed-projects; made once, reused): torch 2.13.0 CPU from the wheel in
# /opt/wheels (never a download of torch), the project with --no-deps, and the dependencies it
# needs by hand; distmesh's package from this tree is installed into it on every run (pip
# install --no-build-isolation ./python, which puts the distmesh-startup.pth that reads
# DISTMESH_REPLACE_GLOO into its site-packages). Skipped with the reason (a "SKIPPED:" line,
# exit 0) when the wheel, python3.11 or a package cannot be had.
#
# Environment: SEED_CACHE; SEED_OUT (the results, default build/seed-projects); SEED_PROJECTS
# (default "optimus llamafactory"); SEED_TESTS (0: leave out Optimus-DL's multi-process tests,
# run its recipe only); SEED_K (a pytest -k expression choosing among Optimus-DL's tests,
# default all); SEED_STEPS (the
# training run's steps, default 6). Exit status 0 when distmesh matched Gloo everywhere.
#
# The two disagree on torchdata (LLaMA-Factory <=0.11.0, Optimus-DL >=0.12.0), hence two
# environments; 0.11.0 is the newest on the package index, so Optimus-DL runs on it too.
set -u -o pipefail                # a comparison piped to tee fails the run
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
WHEEL=$(ls /opt/wheels/torch-2.13.0+cpu-cp311-cp311-*.whl 2>/dev/null | head -n1)
PY311=$(command -v python3.11 || true)
CACHE=${SEED_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/distmesh/seed-projects}
OUT=${SEED_OUT:-$ROOT/build/seed-projects}
STEPS=${SEED_STEPS:-6}
PIP_Q=(-q --no-input --disable-pip-version-check)

skip() { echo "SKIPPED: $*"; exit 0; }
skipped() { echo "SKIPPED: $*"; }
say() { printf '== %s\n' "$*"; }
[ -n "$WHEEL" ] || skip "the torch 2.13.0 CPU wheel is not in /opt/wheels"
[ -n "$PY311" ] || skip "python3.11 not found (the wheel is for CPython 3.11)"
mkdir -p "$CACHE" "$OUT"

# venv NAME PROJECT DEPS...: $CACHE/NAME, made whole or not at all (the stamp comes last)
venv() {
    local name=$1 project=$2 v=$CACHE/$1
    shift 2
    [ -f "$v/installed.stamp" ] && return 0
    say "making $v (once)"
    rm -rf "$v"
    "$PY311" -m venv "$v" || return 1
    "$v/bin/pip" install "${PIP_Q[@]}" "$WHEEL" numpy pytest setuptools wheel >"$OUT/$name-pip.log" 2>&1 || return 1
    "$v/bin/pip" install "${PIP_Q[@]}" --no-deps "$project" >>"$OUT/$name-pip.log" 2>&1 || return 1
    "$v/bin/pip" install "${PIP_Q[@]}" "$@" >>"$OUT/$name-pip.log" 2>&1 || return 1
    # a dependency must never have replaced the CPU wheel
    "$v/bin/python" -c 'import torch; assert torch.__version__ == "2.13.0+cpu", torch.__version__' \
        >>"$OUT/$name-pip.log" 2>&1 || return 1
    touch "$v/installed.stamp"
}

# with_distmesh NAME: this tree's package into the venv, and the startup hook seen working
with_distmesh() {
    local v=$CACHE/$1
    (cd "$ROOT/python" && "$v/bin/pip" install "${PIP_Q[@]}" --no-build-isolation --no-deps --force-reinstall . \
        >"$OUT/$1-distmesh-pip.log" 2>&1) || { echo "FAIL: distmesh did not install into $v ($OUT/$1-distmesh-pip.log)"; return 1; }
    DISTMESH_REPLACE_GLOO=1 "$v/bin/python" - "$OUT" <<'EOF' || { echo "FAIL: DISTMESH_REPLACE_GLOO=1 is not in effect in $v"; return 1; }
import os, sys, tempfile
import torch.distributed as dist
d = tempfile.mkdtemp(dir=sys.argv[1])
dist.init_process_group("gloo", init_method="file://%s/store" % d, rank=0, world_size=1)
assert dist.get_backend() == "distmesh", dist.get_backend()
dist.destroy_process_group()
EOF
}

# ---- Optimus-DL -------------------------------------------------------------------------------
optimus() {
OD_DEPS=(omegaconf hydra-core "torchdata==0.11.0" pyyaml rich pydantic typing_extensions tqdm psutil colorlog
         click zstandard "transformers>=5.2.0" "datasets>=4.0.0" torcheval tiktoken "lm-eval>=0.4.9" pytest-xdist)
venv optimus optimus-dl==0.2.6 "${OD_DEPS[@]}" ||
    { skipped "Optimus-DL's environment could not be installed (pip: $(tail -n 3 "$OUT/optimus-pip.log" | tr '\n' ' '))"
      return 0; }
OD=$CACHE/optimus/bin/python
SRC=$CACHE/optimus-src/optimus_dl-0.2.6
if [ ! -d "$SRC/tests" ]; then       # the tests and configs are in the sdist only
    rm -rf "$CACHE/optimus-src" && mkdir -p "$CACHE/optimus-src"
    "$CACHE/optimus/bin/pip" download "${PIP_Q[@]}" --no-deps --no-binary :all: optimus-dl==0.2.6 \
        -d "$CACHE/optimus-src" >"$OUT/optimus-src.log" 2>&1 &&
        tar -xzf "$CACHE/optimus-src/optimus_dl-0.2.6.tar.gz" -C "$CACHE/optimus-src" ||
        { skipped "Optimus-DL's sdist (its tests and configs) could not be had: $(tail -n 2 "$OUT/optimus-src.log")"
          return 0; }
fi
with_distmesh optimus || { status=1; return 0; }

OD_TESTS=(tests/model/test_tp_collectives.py tests/model/test_tp.py tests/model/test_tp_correctness.py
          tests/model/test_tp_memory.py tests/integration/test_stateful_evaluation.py)
for backend in gloo distmesh; do
    [ "${SEED_TESTS:-1}" = 0 ] && break
    replace=0; [ "$backend" = distmesh ] && replace=1
    say "Optimus-DL's multi-process tests, DISTMESH_REPLACE_GLOO=$replace ($backend)"
    (cd "$SRC" && DISTMESH_REPLACE_GLOO=$replace OMP_NUM_THREADS=1 DISTMESH_TIMEOUT=120 timeout 5400 \
        "$OD" -m pytest -q -p no:cacheprovider -o log_cli=false ${SEED_K:+-k "$SEED_K"} \
        --junitxml="$OUT/optimus-tests-$backend.xml" "${OD_TESTS[@]}" >"$OUT/optimus-tests-$backend.log" 2>&1)
    tail -n 1 "$OUT/optimus-tests-$backend.log"
done
[ "${SEED_TESTS:-1}" = 0 ] ||
"$OD" - "$OUT/optimus-tests-gloo.xml" "$OUT/optimus-tests-distmesh.xml" <<'EOF' | tee "$OUT/optimus-tests.txt" || status=1
import sys, xml.etree.ElementTree as ET
def outcomes(path):
    got = {}
    for case in ET.parse(path).iter("testcase"):
        kinds = [c.tag for c in case if c.tag in ("failure", "error", "skipped")]
        got["%s::%s" % (case.get("classname"), case.get("name"))] = kinds[0] if kinds else "passed"
    return got
gloo, mine = outcomes(sys.argv[1]), outcomes(sys.argv[2])
worse = []
print("%-100s %-8s %s" % ("test", "gloo", "distmesh"))
for name in sorted(set(gloo) | set(mine)):
    g, m = gloo.get(name, "-"), mine.get(name, "-")
    print("%-100s %-8s %s" % (name, g, m))
    if g == "passed" and m != "passed":
        worse.append(name)
print("gloo: %d passed of %d; distmesh: %d passed of %d; passing under Gloo only: %d"
      % (list(gloo.values()).count("passed"), len(gloo), list(mine.values()).count("passed"), len(mine), len(worse)))
sys.exit(1 if worse or not gloo else 0)
EOF

# Optimus-DL's own recipe, tiny: its train_llama_shakespeare.yaml with a local text, no compile
cat > "$SRC/configs/train/distmesh_tiny.yaml" <<EOF
# make test-seed-projects: train_llama_shakespeare.yaml made tiny, on a local text, DDP only
defaults:
  - train_llama_shakespeare
  - override optimization/amp: disabled
  - _self_
args: {iterations: $STEPS, batch_size: 2, seq_len: 32}
model: {n_layer: 2, n_embd: 32, n_head: 2}
model_transforms: [{_name: ddp}]
loggers: [{_name: jsonl, output_dir: "\${common.output_path}/logs", filename: metrics.jsonl, enabled: true}]
lr_scheduler: {warmup_steps: 2}
common: {log_freq: 1, save_freq: 3, eval_freq: 3, eval_iterations: 2, output_path: "\${oc.env:DM_OD_OUT}"}
data:
  scratch:
    base_transforms:
      _name: compose
      transforms:
        - {_name: tokenize, tokenizer_config: {_name: char_tokenize}}
        - {_name: chunk_tokens, max_seq_len: "\${args.seq_len}"}
        - {_name: flat_batcher, batch_size: "\${args.batch_size}", seq_len: "\${args.seq_len}"}
        - {_name: to_device}
  train_datasets:
    source: {_name: loop, inner: {_name: txt_lines, file_link: "\${oc.env:DM_OD_TEXT}"}}
    transform: \${data.scratch.base_transforms}
  eval_datasets:
    tinyshakespeare:
      source: {_name: txt_lines, file_link: "\${oc.env:DM_OD_TEXT}"}
      transform: \${data.scratch.base_transforms}
EOF
sed -e 's/^# make test-seed-projects: .*/# make test-seed-projects: distmesh_tiny with FSDP2 (its fully_shard transform)/' \
    -e 's/^model_transforms: .*/model_transforms: [{_name: fully_shard}]/' \
    "$SRC/configs/train/distmesh_tiny.yaml" > "$SRC/configs/train/distmesh_tiny_fsdp.yaml"
# The recipe with distmesh's own Collective: build_best_collective returns the one it cached,
# which this launcher sets before the recipe runs (the recipe's own code is unchanged).
cat > "$OUT/dm_collective_train.py" <<'PYEOF'
import runpy
import sys

import distmesh
import distmesh.torch
import optimus_dl.modules.distributed as od_distributed

coll = distmesh.init()                  # the launcher's world (torchrun's variables)
distmesh.torch.set_default_group(coll)  # torch's default group: the recipe's checkpoints use it
od_distributed._collective = coll       # what build_best_collective hands the recipe
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
PYEOF
cat "$ROOT"/docs/*.md > "$OUT/optimus-text.txt"
# optimus_train NAME CONFIG REPLACE [LAUNCHER]: one run of the recipe into $OUT/optimus-train-NAME
optimus_train() {
    local name=$1 config=$2 replace=$3 port
    shift 3
    say "Optimus-DL's recipe ($config), $STEPS steps on 2 ranks: $name"
    rm -rf "$OUT/optimus-train-$name"
    port=$("$OD" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    (cd "$SRC" && DISTMESH_REPLACE_GLOO=$replace DM_OD_OUT="$OUT/optimus-train-$name" \
        DM_OD_TEXT="$OUT/optimus-text.txt" OMP_NUM_THREADS=1 DISTMESH_TIMEOUT=120 timeout 900 \
        "$OD" -m torch.distributed.run --nproc-per-node 2 --master-addr 127.0.0.1 --master-port "$port" \
        "$@" scripts/train.py --config-name="$config" >"$OUT/optimus-train-$name.log" 2>&1) ||
        { echo "FAIL: the $name run failed ($OUT/optimus-train-$name.log)"; status=1; }
}
optimus_train gloo distmesh_tiny 0
optimus_train distmesh distmesh_tiny 1
optimus_train collective distmesh_tiny 0 "$OUT/dm_collective_train.py"
optimus_train gloo-fsdp distmesh_tiny_fsdp 0
optimus_train collective-fsdp distmesh_tiny_fsdp 0 "$OUT/dm_collective_train.py"
# optimus_compare GLOO MINE WHAT: every step's figures and the checkpoints' shards the same bits
optimus_compare() {
"$OD" - "$OUT/optimus-train-$1" "$OUT/optimus-train-$2" "$STEPS" "$3" <<'EOF' | tee -a "$OUT/optimus-train.txt" || status=1
import glob, json, os, sys
a, b, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
print("== " + sys.argv[4])
def rows(d, name):
    p = os.path.join(d, "logs", name)
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []
bad = []
for name in ("metrics.jsonl", "metrics_eval_tinyshakespeare.jsonl"):
    ra, rb = rows(a, name), rows(b, name)
    keys = ("step", "loss", "grad_norm", "accuracy", "perplexity")
    ka = [[r.get(k) for k in keys] for r in ra]
    kb = [[r.get(k) for k in keys] for r in rb]
    for x, y in zip(ka, kb):
        print("%-36s step %s loss %.12g / %.12g grad_norm %s / %s" % (name, x[0], x[1], y[1], x[2], y[2]))
    if ka != kb or not ka:
        bad.append("%s differs (%d and %d rows)" % (name, len(ka), len(kb)))
if len([r for r in rows(a, "metrics.jsonl")]) != steps:
    bad.append("the Gloo run logged %d steps, not %d" % (len(rows(a, "metrics.jsonl")), steps))
shards = sorted(glob.glob(os.path.join(a, "checkpoint_*", "*.distcp")))
for p in shards:
    q = os.path.join(b, os.path.relpath(p, a))
    same = os.path.exists(q) and open(p, "rb").read() == open(q, "rb").read()
    print("%-60s %s" % (os.path.relpath(p, a), "bit-equal" if same else "DIFFERS"))
    if not same:
        bad.append("checkpoint shard %s differs" % os.path.relpath(p, a))
if not shards:
    bad.append("no checkpoint shards")
print("training, %s: " % sys.argv[4] + ("distmesh matches Gloo" if not bad else "; ".join(bad)))
sys.exit(1 if bad else 0)
EOF
}
rm -f "$OUT/optimus-train.txt"
optimus_compare gloo distmesh "DDP, DISTMESH_REPLACE_GLOO=1"
optimus_compare gloo collective "DDP, distmesh's Collective in Optimus-DL's place"
optimus_compare gloo-fsdp collective-fsdp "FSDP2, distmesh's Collective in Optimus-DL's place"

}

# ---- LLaMA-Factory ----------------------------------------------------------------------------
llamafactory() {
local deps=("transformers>=4.55.0,<=5.6.0,!=4.57.0" "accelerate>=1.3.0,<=1.11.0" "peft>=0.18.0,<=0.18.1"
            "datasets>=2.16.0,<=4.0.0" omegaconf "torchdata==0.11.0" pyyaml safetensors sentencepiece tiktoken
            einops packaging pydantic fire protobuf)
venv llamafactory llamafactory==0.9.5 "${deps[@]}" ||
    { skipped "LLaMA-Factory's environment could not be installed (pip: $(tail -n 3 "$OUT/llamafactory-pip.log" | tr '\n' ' '))"
      return 0; }
with_distmesh llamafactory || { status=1; return 0; }
local LF=$CACHE/llamafactory/bin/python
local W=$OUT/llamafactory
[ -n "$OUT" ] && rm -rf "$W" && mkdir -p "$W" || return 1
cat > "$W/sitecustomize.py" <<'PY'
# CPU only: LLaMA-Factory's helper.synchronize calls torch.accelerator.synchronize(), which
# raises without an accelerator; there is nothing to wait for on CPU (both runs get this).
import torch
if not torch.accelerator.is_available():
    torch.accelerator.synchronize = lambda *args, **kwargs: None
PY
"$LF" - "$W" >"$W/inputs.log" 2>&1 <<'PY' || { echo "FAIL: the tiny model could not be made ($W/inputs.log)"; status=1; return 0; }
# LLaMA-Factory v1's SFT inputs without the hub: a tiny Llama (LlamaConfig, seed 0) with a
# word-level tokenizer, a chat dataset in its v1 message format, and the run's YAML.
import json, os, sys
import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
out = sys.argv[1]
words = ("the a of to and in is it that was for on are with as his they be at one have this from or had by "
         "word but what some we can out other were all there when up use your how said an each she which do "
         "their time if will way about many then them write would like so these her long make thing see him "
         "two has look more day could go come did number sound no most people my over know water than call").split()
with open(os.path.join(out, "sft.jsonl"), "w") as f:
    for i in range(64):
        q = " ".join(words[(i * 7 + k) % len(words)] for k in range(6))
        a = " ".join(words[(i * 11 + k * 3) % len(words)] for k in range(8))
        f.write(json.dumps({"messages": [{"role": "user", "content": [{"type": "text", "value": q}]},
                                         {"role": "assistant", "content": [{"type": "text", "value": a}]}]}) + "\n")
specials = ["<unk>", "<pad>", "<|im_start|>", "<|im_end|>", "user", "assistant", "\n"]
vocab = {t: i for i, t in enumerate(specials + words)}
tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split("\n", "isolated"), pre_tokenizers.WhitespaceSplit()])
model_dir = os.path.join(out, "model")
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="<|im_end|>",
                        additional_special_tokens=["<|im_start|>", "<|im_end|>"]).save_pretrained(model_dir)
torch.manual_seed(0)
LlamaForCausalLM(LlamaConfig(vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                             num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=128,
                             pad_token_id=vocab["<pad>"], eos_token_id=vocab["<|im_end|>"], bos_token_id=None,
                             tie_word_embeddings=False)).save_pretrained(model_dir)
with open(os.path.join(out, "sft.yaml"), "w") as f:
    f.write("model: %s\ntemplate: chatml\ntrain_dataset: %s\nmicro_batch_size: 2\nglobal_batch_size: 4\n"
            "cutoff_len: 64\nlearning_rate: 1.0e-3\nmax_steps: 4\nbf16: false\nbatching_workers: 0\n"
            "enable_activation_checkpointing: true\nlogging_steps: 1\nseed: 42\ndist_config:\n  name: fsdp2\n"
            % (model_dir, os.path.join(out, "sft.jsonl")))
PY
local backend replace port
for backend in gloo distmesh; do
    replace=0; [ "$backend" = distmesh ] && replace=1
    say "LLaMA-Factory's v1 SFT trainer, FSDP2, 4 steps on 2 ranks, DISTMESH_REPLACE_GLOO=$replace ($backend)"
    port=$("$LF" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    (cd "$W" && DISTMESH_REPLACE_GLOO=$replace PYTHONPATH="$W" OMP_NUM_THREADS=1 DISTMESH_TIMEOUT=120 timeout 900 \
        "$LF" -m torch.distributed.run --nproc-per-node 2 --master-addr 127.0.0.1 --master-port "$port" \
        -m llamafactory.v1.trainers.sft_trainer sft.yaml output_dir="$W/run-$backend" >"$W/run-$backend.log" 2>&1) ||
        { echo "FAIL: the $backend run failed ($W/run-$backend.log)"; status=1; }
done
"$LF" - "$W/run-gloo" "$W/run-distmesh" <<'PY' | tee "$OUT/llamafactory-sft.txt" || status=1
import json, os, sys
a, b = sys.argv[1], sys.argv[2]
def rows(d):
    p = os.path.join(d, "trainer_log.jsonl")
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []
ra, rb = rows(a), rows(b)
bad = []
for x, y in zip(ra, rb):
    print("step %s loss %.12g / %.12g grad_norm %.12g / %.12g" % (x["step"], x["loss"], y["loss"],
                                                                 x["grad_norm"], y["grad_norm"]))
key = lambda rs: [(r["step"], r["loss"], r["grad_norm"]) for r in rs]
if key(ra) != key(rb) or len(ra) != 4:
    bad.append("the logged steps differ (%d and %d rows)" % (len(ra), len(rb)))
names = sorted(n for n in os.listdir(a) if n.endswith(".safetensors")) if os.path.isdir(a) else []
for name in names:
    q = os.path.join(b, name)
    same = os.path.exists(q) and open(os.path.join(a, name), "rb").read() == open(q, "rb").read()
    print("%-40s %s" % (name, "bit-equal" if same else "DIFFERS"))
    if not same:
        bad.append("saved %s differs" % name)
if not names:
    bad.append("no saved model")
print("SFT: " + ("distmesh matches Gloo" if not bad else "; ".join(bad)))
sys.exit(1 if bad else 0)
PY
}

status=0
for project in ${SEED_PROJECTS:-optimus llamafactory}; do
    case "$project" in
        optimus|llamafactory) "$project" ;;
        *) echo "SEED_PROJECTS: no project $project (optimus, llamafactory)"; exit 2 ;;
    esac
done
say "results in $OUT (optimus-tests.txt, optimus-train.txt, llamafactory-sft.txt)"
exit $status
