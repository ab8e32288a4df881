"""The names the command line accepts, free of heavy imports so that bad input fails fast."""

from typing import Literal, get_args

# The one list of methods, in the order of the paper's tables (Table 2, Figure 8).
Algorithm = Literal["Regular", "AvgPush", "CWT", "FedAvg", "FML", "ProxyFL", "Joint"]
ALGORITHMS: tuple[str, ...] = get_args(Algorithm)
MODEL_NAMES: tuple[str, ...] = ("resnet18_gn", "mlp", "cnn1", "cnn2", "lenet5")
JOINT_CENTER: int = -1  # the "centre" of Joint's pooled data in metrics
