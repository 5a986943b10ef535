//! Buckets: the variables of a plan cut into runs of at most a fixed number
//! of elements, so that each collective call moves one bucket, a variable
//! larger than a bucket spans several, and small variables share one.

use std::ops::Range;

/// One piece of a variable inside a bucket.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Segment {
    /// The variable's index in the plan.
    pub(crate) var: usize,
    /// The first element of the piece, within the variable.
    pub(crate) start: usize,
    /// The number of elements.
    pub(crate) len: usize,
    /// Where the piece lies in the bucket.
    pub(crate) at: usize,
}

/// The buckets over some of a plan's variables, in plan order.
#[derive(Clone, Debug, Default)]
pub(crate) struct Buckets {
    pub(crate) segments: Vec<Segment>,
    /// Per bucket: its segments and its length in elements.
    pub(crate) buckets: Vec<(Range<usize>, usize)>,
}

impl Buckets {
    /// Cuts `vars` (plan index, length in elements), in order, into buckets
    /// of at most `cap` elements (`cap` ≥ 1); empty variables take no
    /// segment. O(variables + buckets).
    pub(crate) fn cut(vars: impl Iterator<Item = (usize, usize)>, cap: usize) -> Self {
        debug_assert!(cap >= 1);
        let mut segments = Vec::new();
        let mut buckets = Vec::new();
        let (mut first, mut fill) = (0, 0);
        for (var, len) in vars {
            let mut start = 0;
            while start < len {
                let n = (len - start).min(cap - fill);
                segments.push(Segment {
                    var,
                    start,
                    len: n,
                    at: fill,
                });
                start += n;
                fill += n;
                if fill == cap {
                    buckets.push((first..segments.len(), fill));
                    (first, fill) = (segments.len(), 0);
                }
            }
        }
        if fill > 0 {
            buckets.push((first..segments.len(), fill));
        }
        Self { segments, buckets }
    }

    /// The longest bucket, in elements. O(buckets).
    pub(crate) fn longest(&self) -> usize {
        self.buckets.iter().map(|b| b.1).max().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn covered(b: &Buckets, lens: &[usize], cap: usize) {
        let mut next = vec![0; lens.len()];
        for (range, len) in &b.buckets {
            assert!(*len <= cap && *len > 0);
            let mut at = 0;
            for s in &b.segments[range.clone()] {
                assert_eq!(s.at, at);
                assert_eq!(s.start, next[s.var]);
                next[s.var] += s.len;
                at += s.len;
            }
            assert_eq!(at, *len);
        }
        assert_eq!(next, lens);
    }

    #[test]
    fn buckets_cover_every_element_once_in_order() {
        for cap in [1, 2, 3, 7, 100] {
            let lens = [5, 0, 1, 12, 3, 3];
            let b = Buckets::cut(lens.iter().copied().enumerate(), cap);
            covered(&b, &lens, cap);
            let total: usize = lens.iter().sum();
            assert_eq!(b.buckets.len(), total.div_ceil(cap));
        }
    }

    #[test]
    fn a_bucket_of_one_element_has_one_segment_each() {
        let b = Buckets::cut([(0, 3), (1, 2)].into_iter(), 1);
        assert_eq!(b.buckets.len(), 5);
        assert_eq!(b.longest(), 1);
        assert!(b.buckets.iter().all(|(r, _)| r.len() == 1));
    }

    #[test]
    fn nothing_makes_no_bucket() {
        let b = Buckets::cut(std::iter::empty(), 4);
        assert!(b.buckets.is_empty());
        assert_eq!(b.longest(), 0);
    }
}
