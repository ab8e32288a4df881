"""What every package of the pipeline shares: atomic writes, the error base class, and the
command line generated from the parameter models."""
