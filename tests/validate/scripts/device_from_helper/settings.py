"""The project's settings: the device its scripts use, named where no source scan of the script sees it."""
import torch

DEVICE = torch.device("".join(["neu", "ron"]))
