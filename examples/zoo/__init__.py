"""The zoo: architectures as torchvision and timm ship them, seeded, for the whole chain."""
