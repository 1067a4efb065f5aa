"""Time and peak memory of every method against SDPA: ``python scripts/benchmark.py --help``."""

from hf_efficient_attn.benchmark import main

if __name__ == "__main__":
    main()
