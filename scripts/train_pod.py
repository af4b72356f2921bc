#!/usr/bin/env python
"""Fine-tuning on a TPU pod slice or a multi-host GPU cluster: run the same command on every host.

    python scripts/train_pod.py --model_name_or_path gs-mounted/bert-base --train_file train.csv \\
        --validation_file dev.csv --output_dir /shared/run1 --mesh data=-1 --dtype bfloat16 --data_shards 8

It is `flaxheads train` with `--distributed` on: jax.distributed.initialize() finds the other
hosts from the TPU or SLURM environment (or pass --coordinator_address/--num_processes/
--process_id). Every host reads and tokenises only its own shards of the data (--data_shards: the
host count or a multiple); process 0 writes logs and exports; all hosts write the Orbax
checkpoints together, so --output_dir must be shared storage.
"""

import sys

from flaxheads.cli import main

if __name__ == "__main__":
    argv = sys.argv[1:]
    sys.exit(main(["train", "--distributed", *argv]))
