"""The sandbox image recipe (``Dockerfile``), shipped as package data so a plain install can build the image."""
