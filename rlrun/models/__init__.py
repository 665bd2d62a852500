"""Where the model comes from: the tiny demo model built locally, a GGUF file shipped by a package
rebuilt into an HF folder, a folder, the hub; each built once into rlrun's model cache."""
