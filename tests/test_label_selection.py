"""Next Sample's choice (``calib_monai.label.selection``) on hand-made pools whose answer is known by construction:
two groups of images far apart in feature space, the case scores set so that the least confident image overall is
an outlier, and labels that cover one group."""

from __future__ import annotations

import numpy as np
import pytest

from calib_monai.label.selection import kmeans, next_to_label, standardized, typicality


def _pool():
    """Five images around (0, 0) (indices 0-4), four around (10, 10) (5-8, with 6 at the centre) and one outlier at
    (30, -30) (9). The outlier is the least confident, then 6, the small group's centre, then 2 in the large group."""
    features = np.array(
        [[0, 0], [0.5, 0], [0, 0.5], [-0.5, 0], [0, -0.5], [11, 10], [10, 10], [10, 11], [9, 9], [30, -30]],
        dtype=float,
    )
    scores = np.array([0.90, 0.85, 0.40, 0.80, 0.88, 0.70, 0.30, 0.75, 0.72, 0.10])
    return scores, features


def test_standardized_scales_columns_and_drops_constant_ones():
    x = np.array([[1.0, 5.0, 2.0], [3.0, 5.0, 4.0], [5.0, 5.0, 9.0]])
    out = standardized(x)
    assert out.shape == (3, 2)  # the constant column is gone
    np.testing.assert_allclose(out[:, 0], [-np.sqrt(1.5), 0.0, np.sqrt(1.5)])  # (1, 3, 5): mean 3, spread sqrt(8/3)
    np.testing.assert_allclose(out.mean(0), 0.0, atol=1e-15)
    np.testing.assert_allclose(out.std(0), 1.0)


def test_typicality_is_the_inverse_mean_distance_to_the_nearest_neighbours():
    x = np.array([[0.0], [1.0], [3.0], [7.0]])
    # two nearest others: 0 -> (1, 3), 1 -> (1, 2), 3 -> (2, 3), 7 -> (4, 6)
    np.testing.assert_allclose(typicality(x, neighbours=2), [1 / 2.0, 1 / 1.5, 1 / 2.5, 1 / 5.0])
    # more neighbours asked than there are others: all others
    np.testing.assert_allclose(typicality(x, neighbours=20)[0], 1 / ((1 + 3 + 7) / 3))
    np.testing.assert_array_equal(typicality(np.zeros((1, 2))), [1.0])


def test_kmeans_separates_groups_far_apart_whatever_the_seed():
    _, features = _pool()
    for seed in range(5):
        assigned = kmeans(features[:9], 2, seed=seed)
        assert len(set(assigned[:5])) == 1 and len(set(assigned[5:9])) == 1 and assigned[0] != assigned[5]
    # fewer distinct rows than clusters asked: as many clusters as distinct rows
    assert set(kmeans(np.array([[1.0], [1.0], [2.0]]), 3)) == {0, 1}


def test_no_label_yet_takes_the_least_confident_of_the_typical_half_not_the_outlier():
    scores, features = _pool()
    assert int(np.argmin(scores)) == 9  # what plain least-confident would hand out: the outlier
    # one part (no labels): the typical half is the large group's five, and of them 2 is the least confident
    assert next_to_label(scores, features, by_score=True) == 2


def test_labels_send_the_next_image_to_the_largest_part_without_one_and_never_to_an_outlier():
    scores, features = _pool()
    rest = [i for i in range(10) if i != 2]
    # a label in the large group: the small group is the largest part without one, 6 its least confident
    assert rest[next_to_label(scores[rest], features[rest], features[[2]], by_score=True)] == 6
    # both groups covered: the lone outlier is not a part; finer parts of the groups come first
    rest = [i for i in range(10) if i not in (2, 6)]
    assert rest[next_to_label(scores[rest], features[rest], features[[2, 6]], by_score=True)] != 9


def _most_central(x: np.ndarray) -> int:
    """Brute force: the row with the smallest mean Euclidean distance to all other rows."""
    return min(range(len(x)), key=lambda i: sum(np.linalg.norm(x[i] - x[j]) for j in range(len(x)) if j != i))


def test_typiclust_takes_the_most_typical_image_of_the_largest_part_without_a_label():
    scores, features = _pool()
    # no label: one part, all 10 images; with fewer than 20 others, typicality is the inverse mean distance to all
    first = _most_central(standardized(features))
    assert first in range(5) and next_to_label(scores, features) == first  # in the large group, whatever the scores
    assert next_to_label(scores[::-1], features[::-1]) == 9 - first  # the same image, listed last
    # a label in the large group: the small group's centre (equidistant from its three others), not the outlier
    rest = [i for i in range(10) if i != 2]
    assert rest[next_to_label(scores[rest], features[rest], features[[2]])] == 6


def test_unscored_candidates_come_last_and_alike_images_fall_back_to_the_lowest_score():
    scores, features = _pool()
    scores = scores.copy()
    scores[2] = np.nan
    assert next_to_label(scores, features, by_score=True) == 3  # 0.80, the next lowest of the large group
    same = np.ones((3, 4))
    assert next_to_label(np.array([0.5, 0.2, 0.9]), same, by_score=True) == 1


@pytest.mark.parametrize(
    "scores, features, labelled, match",
    [
        (np.array([0.5, 0.6]), np.zeros((3, 2)), None, "must be"),
        (np.array([0.5, 0.6]), np.zeros((2, 2)), np.zeros((1, 3)), "must be"),
        (np.array([]), np.zeros((0, 2)), None, "no candidates"),
        (np.array([0.5, 0.6]), np.array([[0.0, np.nan], [1.0, 2.0]]), None, "NaN"),
    ],
)
def test_bad_input_names_what_is_wrong(scores, features, labelled, match):
    with pytest.raises(ValueError, match=match):
        next_to_label(scores, features, labelled)
