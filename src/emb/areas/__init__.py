"""Areas, not rasters: regions planned from an areas file and the tile collections users
download (AEF COGs with their published index, geotessera tiles, CDL national files or tiles).

``plan`` is pure and runs while the workflow is parsed (every job listed by ``snakemake -n``);
``build`` writes the VRTs it planned; ``fetch`` downloads exactly the tiles a plan needs.
"""


class AreasError(ValueError):
    """An areas file, index or collection that cannot give regions: one line naming the file,
    the area and what was found."""
