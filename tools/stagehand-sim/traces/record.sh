#!/usr/bin/env bash
# Records the real-model traces that make bench-policy replays, with the
# recorder of the Python package (python -m stagehand trace): shapes only, on
# the meta device, with an RTX 4090's roofline, in cudaMallocAsync mode (a
# region per tensor), 4 steps each, steps and phases marked; region ids never
# reused but in gpt-full-reuse, whose ids come back as the library's pool
# reuses a freed region's address (--ids reuse).
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
record gpt-full "gpt:$gpt"
record gpt-full-reuse "gpt:$gpt" --ids reuse
record gpt-lora "gpt:$gpt,lora=16"
record gpt-ckpt "gpt:$gpt,ckpt=1"
record resnet50 "resnet:depth=50,batch=128"
record vit-l16 "vit:layers=24,d=1024,heads=16,batch=64"
record unet "unet:ch=192,batch=8"
