"""Model classes, their registry and the safetensors loader."""
