"""Share a variant on the Hugging Face Hub with its model card and code: ``python scripts/push_to_hub.py --help``."""

from hf_efficient_attn.hub.cli import main
from hf_efficient_attn.utils.cli_errors import run_cli

if __name__ == "__main__":
    run_cli(main)
