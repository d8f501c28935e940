"""Datasets and transforms: Fashion-MNIST (idx files), image folders, transforms from timm data configs."""

from .build import Seeded, build_dataset, list_datasets, register_dataset, subset
from .fashion_mnist import DataError, FashionMNIST
from .folder import ImageFolder
from .transforms import DataConfig, data_config_from_model, make_data_config

__all__ = [
    "DataConfig", "DataError", "FashionMNIST", "ImageFolder", "Seeded", "build_dataset", "data_config_from_model",
    "list_datasets", "make_data_config", "register_dataset", "subset",
]
