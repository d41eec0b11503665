"""Entry point: `python -m olmo_train CONFIG [--key=value ...]`, or the same under `torchrun`."""

import sys

from olmo_train.train import main

if __name__ == "__main__":
    sys.exit(main())
