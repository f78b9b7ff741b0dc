"""Synthetic stand-in for the Oxford-IIIT Pet images that cv_example.py reads (the download fails here):
RGB JPEG files named `<breed>_<n>.jpg`, as the dataset names them, so that the script's own
`extract_label` and `PetsDataset` read them unchanged. Random pixels, seeded; a few sizes, as photos have.

    python make_pets.py DIR [--per-breed 8]
"""

import argparse
import os

import numpy as np
from PIL import Image

# The dataset's 37 breeds (12 cats, capitalised as the dataset's file names are; 25 dogs)
BREEDS = ["Abyssinian", "Bengal", "Birman", "Bombay", "British_Shorthair", "Egyptian_Mau", "Maine_Coon", "Persian",
          "Ragdoll", "Russian_Blue", "Siamese", "Sphynx", "american_bulldog", "american_pit_bull_terrier",
          "basset_hound", "beagle", "boxer", "chihuahua", "english_cocker_spaniel", "english_setter",
          "german_shorthaired", "great_pyrenees", "havanese", "japanese_chin", "keeshond", "leonberger",
          "miniature_pinscher", "newfoundland", "pomeranian", "pug", "saint_bernard", "samoyed", "scottish_terrier",
          "shiba_inu", "staffordshire_bull_terrier", "wheaten_terrier", "yorkshire_terrier"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("data_dir")
    parser.add_argument("--per-breed", type=int, default=8)
    args = parser.parse_args()
    os.makedirs(args.data_dir, exist_ok=True)
    rng = np.random.default_rng(0)
    for breed in BREEDS:
        for n in range(1, args.per_breed + 1):
            height, width = rng.choice([(96, 128), (128, 96), (112, 112)])
            pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(os.path.join(args.data_dir, f"{breed}_{n}.jpg"), quality=90)


if __name__ == "__main__":
    main()
