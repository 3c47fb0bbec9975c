"""Docker: images, networks and containers for a bottle and its gate."""
