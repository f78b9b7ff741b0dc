"""The model contract: what mgpu needs to know to train, check or time any PyTorch model.

    python -m mgpu check examples/tiny_lm.py:spec                                 # a ModelSpec
    python -m mgpu check torchvision.models:resnet18 --input-shape 3,32,32 --classes 10   # a module

A user points mgpu at `MODULE:FUNCTION` (a module name, or a path to a .py file). The function
returns either a `ModelSpec`, or an `nn.Module` that takes images (then the input shape and the
class count say what synthetic batches look like). A spec holds:

* `build()`: a new model. mgpu calls it under a seed it chooses, on the CPU.
* `draw(n, generator)`: a batch of n examples, `(inputs, target)`: `inputs` one tensor or a tuple
  of tensors (the model is called as `model(*inputs)`), each with the examples along dim 0, as
  is `target`. Everything random comes from `generator`, so the same seed gives the same batch.
* `loss(output, target)`: the loss *summed* over the examples (default: cross-entropy). A sum,
  not a mean, so that shards of any size add up to the global batch's loss; mgpu scales it by
  1 / global batch size itself.
* `correct(output, target)`: how many examples are right, summed (default: argmax over the last
  dimension equals the target, averaged over any other non-batch dimensions of an example).
* `optimizer(params)`: optional; default, the suite's SGD.

mgpu's own networks are two such specs (`builtin_spec("resnet18")`, `builtin_spec("lenet")`).
Everything a user can get wrong here is a `SpecError` naming the problem (one line from the CLI).
"""

from mgpu.spec.contract import (LABELS_LOSSES, ModelLoss, ModelSpec, Objective, OnOutput, argmax_correct, as_inputs,
                                batch_length, cross_entropy_sum, select_output, slice_inputs)
from mgpu.spec.loading import ImageBatches, builtin_spec, image_spec, load_spec, parse_input_shape
from mgpu.spec.validation import validate_spec

__all__ = ["ModelSpec", "Objective", "ModelLoss", "LABELS_LOSSES", "select_output", "OnOutput", "ImageBatches", "image_spec", "builtin_spec", "load_spec", "parse_input_shape",
           "as_inputs", "batch_length", "slice_inputs", "cross_entropy_sum", "argmax_correct", "validate_spec"]
