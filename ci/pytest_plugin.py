"""lanekeeper's pytest plugin: matrix options and the engine-process guard."""
