"""The output noun: the artifact folder's layout, its typed manifest, the staging draft and the store."""
