"""The names the command line accepts, free of heavy imports so that bad input fails fast."""

ALGORITHMS: tuple[str, ...] = ("ProxyFL", "FML", "FedAvg", "AvgPush", "CWT", "Regular", "Joint")
MODEL_NAMES: tuple[str, ...] = ("resnet18_gn", "mlp", "cnn1", "cnn2", "lenet5")
JOINT_CENTER: int = -1  # the "centre" of Joint's pooled data in metrics
