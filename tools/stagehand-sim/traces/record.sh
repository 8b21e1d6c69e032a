#!/usr/bin/env bash
# Records the real-model traces that make bench-policy replays, with the
# recorder of the Python package (python -m stagehand trace): shapes only, on
# the meta device, with an RTX 4090's roofline, in cudaMallocAsync mode (a
# region per tensor), 4 steps each, steps and phases marked; each model twice:
# with region ids never reused, and as NAME-reuse, whose ids come back as the
# library's pool reuses a freed region's address (--ids reuse).
# Usage: tools/stagehand-sim/traces/record.sh [PYTHON]   (from the repository root)
set -euo pipefail
py=${1:-/usr/bin/python3}
dir=tools/stagehand-sim/traces
export PYTHONPATH=python${PYTHONPATH:+:$PYTHONPATH}
gpt=layers=24,d=2048,heads=16,seq=1024,batch=8
record() { # record NAME MODEL [OPTION...]
    "$py" -m stagehand trace "$2" --gpu rtx4090 --mode async --steps 4 "${@:3}" \
        -o "$dir/$1.trace.gz"
}
# each model twice: NAME with ids never reused, NAME-reuse with --ids reuse
both() { # both NAME MODEL
    record "$1" "$2"
    record "$1-reuse" "$2" --ids reuse
}
both gpt-full "gpt:$gpt"
both gpt-lora "gpt:$gpt,lora=16"
both gpt-ckpt "gpt:$gpt,ckpt=1"
both resnet50 "resnet:depth=50,batch=128"
both vit-l16 "vit:layers=24,d=1024,heads=16,batch=64"
both unet "unet:ch=192,batch=8"
