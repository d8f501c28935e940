"""Datasets and transforms: Fashion-MNIST (idx files), image folders, transforms from timm data configs."""

from .build import OnDemand, Seeded, build_dataset, is_dense, list_datasets, register_dataset, subset
from .fashion_mnist import DataError, FashionMNIST
from .folder import ImageFolder
from .mosaic import Mosaic, build_mosaic
from .scenes import SceneMasks, Scenes
from .transforms import DataConfig, data_config_from_model, make_data_config

__all__ = [
    "DataConfig", "DataError", "FashionMNIST", "ImageFolder", "Mosaic", "OnDemand", "SceneMasks", "Scenes", "Seeded",
    "build_dataset", "build_mosaic", "data_config_from_model", "is_dense", "list_datasets", "make_data_config",
    "register_dataset", "subset",
]
