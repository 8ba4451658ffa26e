"""Prints every scalar of the event files in a directory as JSON {tag: [[step, value], ...]}, read by
TensorBoard's own EventAccumulator (what `tensorboard --logdir` uses)."""
import json
import sys

from tensorboard.backend.event_processing import event_accumulator

acc = event_accumulator.EventAccumulator(sys.argv[1], size_guidance={event_accumulator.SCALARS: 0})
acc.Reload()
print(json.dumps({tag: [[e.step, e.value] for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}))
