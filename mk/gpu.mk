# Real-GPU suite: see tests/gpu/README.md.
.PHONY: gpu-test
gpu-test:
	@echo "gpu-test: not written yet"
