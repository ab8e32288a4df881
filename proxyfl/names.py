"""The names the command line accepts, free of heavy imports so that bad input fails fast."""

from typing import Literal, get_args

# The one list of methods: the ProxyFL paper's, in the order of its tables (Table 2,
# Figure 8), then PrivateKT (Qi et al. 2023), which that paper does not compare with.
Algorithm = Literal["Regular", "AvgPush", "CWT", "FedAvg", "FML", "ProxyFL", "Joint", "PrivateKT"]
ALGORITHMS: tuple[str, ...] = get_args(Algorithm)
# The seven methods of the ProxyFL paper's histopathology experiment.
PAPER_ALGORITHMS: tuple[str, ...] = ALGORITHMS[:7]
MODEL_NAMES: tuple[str, ...] = ("resnet18_gn", "mlp", "cnn1", "cnn2", "lenet5")
JOINT_CENTER: int = -1  # the "centre" of Joint's pooled data in metrics
# What starts a training job's ranks (proxyfl.launch.placement.Placement): MPICH's mpiexec (on
# this machine, or across hosts over ssh), or Slurm's srun inside an allocation.
Launcher = Literal["mpiexec", "srun", "flare"]
LAUNCHERS: tuple[str, ...] = get_args(Launcher)


# CUDA's caching allocator for every rank unless the user set PYTORCH_CUDA_ALLOC_CONF: a
# rank holds what it allocated, not the largest blocks it ever cached (four ProxyFL ranks
# on one H100: 16-22 GB each by default, 10-12 GB with it, same speed; ../shared/gpu)
CUDA_ALLOCATOR_SETTING = "expandable_segments:True"
