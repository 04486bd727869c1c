"""Tree shapes: literal masks, position offsets and paths; policies; bad parameters."""

import pytest
import torch

from specscope.trees import (
    TreeConfig,
    TreeConfigError,
    TreeShape,
    ancestor_mask,
    bfs_prefix,
    bfs_shape,
    contiguous_ranks,
    cut_depth,
)

T, F = True, False


def test_chain_buffers():
    shape = TreeConfig(policy="chain", depth=4).shape()
    assert shape.parents == (-1, 0, 1, 2)
    assert shape.paths == ((0,), (0, 0), (0, 0, 0), (0, 0, 0, 0))
    assert shape.ancestor_mask().tolist() == [
        [T, F, F, F],
        [T, T, F, F],
        [T, T, T, F],
        [T, T, T, T],
    ]
    assert shape.position_offsets().tolist() == [0, 1, 2, 3]
    assert shape.leaf_paths() == [[0, 1, 2, 3]]


def test_paper_tree_buffers():
    shape = TreeConfig(policy="paper").shape()
    assert shape.depth_counts() == (2, 4, 2)
    assert shape.paths == ((0,), (1,), (0, 0), (0, 1), (1, 0), (1, 1), (0, 0, 0), (0, 0, 1))
    assert shape.parents == (-1, -1, 0, 0, 1, 1, 2, 2)
    assert shape.ancestor_mask().tolist() == [
        [T, F, F, F, F, F, F, F],
        [F, T, F, F, F, F, F, F],
        [T, F, T, F, F, F, F, F],
        [T, F, F, T, F, F, F, F],
        [F, T, F, F, T, F, F, F],
        [F, T, F, F, F, T, F, F],
        [T, F, T, F, F, F, T, F],
        [T, F, T, F, F, F, F, T],
    ]
    assert shape.position_offsets().tolist() == [0, 0, 1, 1, 1, 1, 2, 2]
    assert shape.leaf_paths() == [[0, 3], [1, 4], [1, 5], [0, 2, 6], [0, 2, 7]]


def test_six_node_static_tree():
    shape = TreeShape.parse("[(0,), (1,), (2,), (0, 0), (0, 1), (1, 0)]")
    assert shape.parents == (-1, -1, -1, 0, 0, 1)
    assert shape.ancestor_mask().tolist() == [
        [T, F, F, F, F, F],
        [F, T, F, F, F, F],
        [F, F, T, F, F, F],
        [T, F, F, T, F, F],
        [T, F, F, F, T, F],
        [F, T, F, F, F, T],
    ]
    assert shape.position_offsets().tolist() == [0, 0, 0, 1, 1, 1]
    assert shape.leaf_paths() == [[2], [0, 3], [0, 4], [1, 5]]


def test_paper_text_reading_is_cut_by_the_node_cap():
    shape = TreeConfig(policy="paper-text").shape()
    assert shape.depth_counts() == (3, 5)  # 3 roots, 5 of 6 children, nothing left for depth 3
    assert len(bfs_shape(3, 2, 3, 100)) == 3 + 6 + 12


def test_paths_round_trip_and_order():
    shape = TreeShape.from_paths([(0, 0), (1,), (0,)])
    assert shape.paths == ((0,), (1,), (0, 0))
    assert TreeShape.parse(shape.to_paths_literal()) == shape


def test_mask_rows_are_parent_rows_plus_self():
    shape = TreeConfig(policy="paper").shape()
    mask = shape.ancestor_mask()
    for i, p in enumerate(shape.parents):
        expected = torch.zeros(len(shape), dtype=torch.bool) if p < 0 else mask[p].clone()
        expected[i] = True
        assert torch.equal(mask[i], expected)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"policy": "beam"}, "unknown tree policy 'beam'"),
        ({"depth": 0}, "depth must be >= 1"),
        ({"max_nodes": 1, "top_k": 3, "branch": 2}, "smaller than the number of roots"),
        ({"policy": "static"}, "needs paths"),
        ({"policy": "static", "paths": "[(0, 0)]"}, "no parent path"),
        ({"policy": "static", "paths": "nonsense("}, "cannot parse"),
    ],
)
def test_bad_tree_parameters(kwargs, message):
    with pytest.raises(TreeConfigError, match=message.replace("(", r"\(")):
        TreeConfig(**kwargs).shape()


def test_shape_helpers():
    shape = TreeShape.parse("[(0,), (2,), (0, 1), (0, 3), (2, 2), (0, 1, 0)]")
    assert contiguous_ranks(shape).paths == ((0,), (1,), (0, 0), (0, 1), (1, 0), (0, 0, 0))
    assert cut_depth(shape, 2).paths == shape.paths[:5]
    assert cut_depth(shape, 9) is shape and bfs_prefix(shape, 2).paths == ((0,), (2,))


def test_ancestor_mask_of_a_growing_parents_array():
    # a dynamic tree as it grows: parents come before children, not in breadth-first order
    parents = [-1, -1, 0, 1, 0, 2]
    assert ancestor_mask(parents).tolist() == [
        [T, F, F, F, F, F],
        [F, T, F, F, F, F],
        [T, F, T, F, F, F],
        [F, T, F, T, F, F],
        [T, F, F, F, T, F],
        [T, F, T, F, F, T],
    ]
    shape = TreeShape.parse("[(0,), (1,), (0, 0), (0, 1), (1, 0)]")
    assert torch.equal(shape.ancestor_mask(), ancestor_mask(shape.parents))


def test_dynamic_trees_are_refused_for_measurement_with_the_reason():
    with pytest.raises(TreeConfigError, match="'dynamic' .* is for decoding"):
        TreeConfig(policy="dynamic")
