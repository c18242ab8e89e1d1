"""`python -m vllm_deploy` is the CLI."""
import sys

from .cli import main

sys.exit(main())
