"""What the tests share: helper modules, the scripts they run as processes, fixtures."""
