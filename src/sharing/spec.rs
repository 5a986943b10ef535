//! [`VarSpec`]: what one `get_variable` call asks for, built by a few
//! builder calls; its name is kept inline up to 23 bytes (`SpecName`), and
//! its rarely set parts share one box, so a reuse spec is cheap to build,
//! pass and drop.

use std::fmt;

use crate::sharing::chain::CustomGetter;
use crate::sharing::init::Initializer;
use crate::sharing::reuse::Reuse;
use crate::sharing::shape::Shape;

/// What one `get_variable` call asks for: the name (relative to the scope),
/// and optionally a shape, an initializer, the trainable flag, the
/// collections, a reuse mode for this call only, and a custom getter that
/// replaces the scope's chain for this call.
///
/// The name, reuse mode and shape are kept inline; the initializer, trainable
/// flag, collections and custom getter (rarely given on reuse) share one box,
/// allocated by the first of those builder calls, so a reuse spec is a few
/// words to build, pass and drop.
///
/// ```
/// use scopetree::sharing::{Initializer, VarSpec};
/// let spec = VarSpec::new("w")
///     .shape([2])
///     .initializer(Initializer::with_shape(|s: &[usize]| vec![0.0_f32; s[0]]))
///     .trainable(true);
/// assert_eq!(spec.name(), "w");
/// ```
pub struct VarSpec<T> {
    pub(super) name: SpecName,
    pub(super) reuse: Reuse,
    pub(super) shape: Option<Shape>,
    /// The parts a reuse call rarely sets, boxed so that the common spec
    /// (name, reuse mode, maybe a shape) stays small to build, pass and drop.
    pub(super) rare: Option<Box<Rare<T>>>,
}

/// The rarely set parts of a [`VarSpec`].
pub(super) struct Rare<T> {
    pub(super) init: Option<Initializer<T>>,
    pub(super) trainable: Option<bool>,
    pub(super) collections: Option<Vec<String>>,
    pub(super) getter: Option<CustomGetter>,
}

impl<T> Default for Rare<T> {
    fn default() -> Self {
        Rare {
            init: None,
            trainable: None,
            collections: None,
            getter: None,
        }
    }
}

impl<T> fmt::Debug for VarSpec<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let rare = self.rare.as_deref();
        f.debug_struct("VarSpec")
            .field("name", &self.name.as_str())
            .field("shape", &self.shape)
            .field("initializer", &rare.and_then(|r| r.init.as_ref()))
            .field("trainable", &rare.and_then(|r| r.trainable))
            .field("collections", &rare.and_then(|r| r.collections.as_ref()))
            .field("reuse", &self.reuse)
            .field("custom_getter", &rare.is_some_and(|r| r.getter.is_some()))
            .finish()
    }
}

impl<T> VarSpec<T> {
    /// A spec for the variable `name`, relative to the scope it is asked in
    /// (it may contain `/`: `"a/b"` is `b` in the sub-scope `a`). A name of
    /// up to 23 bytes is kept inline, so building a spec allocates nothing.
    /// O(len).
    ///
    /// ```
    /// use scopetree::sharing::VarSpec;
    /// assert_eq!(VarSpec::<f32>::new("v").name(), "v");
    /// assert_eq!(VarSpec::<f32>::new(format!("w{}", 3)).name(), "w3");
    /// ```
    #[inline]
    pub fn new(name: impl AsRef<str>) -> Self {
        VarSpec {
            name: SpecName::new(name.as_ref()),
            reuse: Reuse::Inherit,
            shape: None,
            rare: None,
        }
    }

    /// The rarely set parts, boxed on first use (one allocation per spec).
    fn rare_mut(&mut self) -> &mut Rare<T> {
        self.rare.get_or_insert_with(Box::default)
    }

    /// The name asked for. O(1).
    ///
    /// ```
    /// use scopetree::sharing::VarSpec;
    /// assert_eq!(VarSpec::<u8>::new("b").name(), "b");
    /// ```
    pub fn name(&self) -> &str {
        self.name.as_str()
    }

    /// The expected shape: checked against the held value on reuse and
    /// against the initializer's value on create, and passed to a
    /// shape-taking initializer. Without it the shape is unknown and matches
    /// anything. O(rank).
    ///
    /// ```
    /// use scopetree::sharing::{Shape, VarSpec};
    /// let spec = VarSpec::<Vec<f32>>::new("v").shape(Shape::from_dims([None]));
    /// # let _ = spec;
    /// ```
    pub fn shape(mut self, shape: impl Into<Shape>) -> Self {
        self.shape = Some(shape.into());
        self
    }

    /// The initializer, used only if the variable is created; it wins over
    /// the scope's default for `T`. O(1).
    ///
    /// ```
    /// use scopetree::sharing::{Initializer, VarSpec};
    /// let spec = VarSpec::new("v").initializer(Initializer::constant(0_u32));
    /// # let _ = spec;
    /// ```
    pub fn initializer(mut self, init: Initializer<T>) -> Self {
        self.rare_mut().init = Some(init);
        self
    }

    /// Whether a created variable is trainable (added to
    /// [`TRAINABLE_VARIABLES`]); wins over the scope default; without either,
    /// `true`. O(1).
    ///
    /// [`TRAINABLE_VARIABLES`]: crate::sharing::TRAINABLE_VARIABLES
    ///
    /// ```
    /// use scopetree::sharing::VarSpec;
    /// let spec = VarSpec::<f32>::new("step").trainable(false);
    /// # let _ = spec;
    /// ```
    pub fn trainable(mut self, trainable: bool) -> Self {
        self.rare_mut().trainable = Some(trainable);
        self
    }

    /// The collections a created variable joins, replacing the default
    /// [`GLOBAL_VARIABLES`] (as in TensorFlow); a trainable variable also joins
    /// [`TRAINABLE_VARIABLES`]. O(number of collections).
    ///
    /// [`GLOBAL_VARIABLES`]: crate::sharing::GLOBAL_VARIABLES
    /// [`TRAINABLE_VARIABLES`]: crate::sharing::TRAINABLE_VARIABLES
    ///
    /// ```
    /// use scopetree::sharing::VarSpec;
    /// let spec = VarSpec::<f32>::new("v").collections(["variables", "mine"]);
    /// # let _ = spec;
    /// ```
    pub fn collections<S: Into<String>>(
        mut self,
        collections: impl IntoIterator<Item = S>,
    ) -> Self {
        self.rare_mut().collections = Some(collections.into_iter().map(Into::into).collect());
        self
    }

    /// A reuse mode for this call only (TensorFlow's `reuse=` argument of
    /// `get_variable`); `Inherit` (the default) takes the scope's. O(1).
    ///
    /// ```
    /// use scopetree::sharing::{Reuse, VarSpec};
    /// let spec = VarSpec::<f32>::new("v").reuse(Reuse::AutoReuse);
    /// # let _ = spec;
    /// ```
    pub fn reuse(mut self, reuse: Reuse) -> Self {
        self.reuse = reuse;
        self
    }

    /// A custom getter for this call only: it *replaces* the scope's chain
    /// (as TensorFlow's `custom_getter=` argument does). O(1).
    ///
    /// ```
    /// use scopetree::sharing::{CustomGetter, VarSpec};
    /// let spec = VarSpec::<f32>::new("v").custom_getter(CustomGetter::new(|s, a, next| next.get(s, a)));
    /// # let _ = spec;
    /// ```
    pub fn custom_getter(mut self, getter: CustomGetter) -> Self {
        self.rare_mut().getter = Some(getter);
        self
    }
}

/// The name of a [`VarSpec`]: inline up to [`SpecName::INLINE`] bytes, in
/// one 24-byte image (the length, then the bytes, zero-padded), else on the
/// heap.
#[derive(Clone)]
pub(super) struct SpecName {
    /// `image[0]` is the length of an inline name; the bytes follow.
    image: [u8; 24],
    /// A name longer than [`INLINE`](Self::INLINE) bytes.
    pub(super) heap: Option<Box<str>>,
}

impl SpecName {
    const INLINE: usize = 23;

    #[inline]
    fn new(name: &str) -> Self {
        match u8::try_from(name.len()) {
            Ok(len) if name.len() <= Self::INLINE => SpecName {
                image: Self::image(len, name.as_bytes()),
                heap: None,
            },
            _ => SpecName {
                image: [0; 24],
                heap: Some(name.into()),
            },
        }
    }

    /// The image of an inline name `src` of `len` bytes. The bytes are
    /// gathered by overlapping fixed-size loads into integers and the image
    /// is stored as three 8-byte words: no call to `memcpy` of a variable
    /// length, and no narrow stores that the spec's later 8-byte moves would
    /// have to wait for. O(1).
    #[inline]
    fn image(len: u8, src: &[u8]) -> [u8; 24] {
        fn load<const N: usize>(s: &[u8], at: usize) -> [u8; N] {
            s.get(at..at + N)
                .and_then(|c| c.try_into().ok())
                .unwrap_or([0; N])
        }
        let n = src.len();
        let byte = |i: usize| u128::from(src.get(i).copied().unwrap_or(0)) << (8 * i);
        // Bytes 0..16 of the name, and bytes 16..23.
        let (lo, hi): (u128, u64) = match n {
            0 => (0, 0),
            1..=3 => (byte(0) | byte(n / 2) | byte(n - 1), 0),
            4..=7 => {
                let tail = u128::from(u32::from_le_bytes(load(src, n - 4)));
                (
                    u128::from(u32::from_le_bytes(load(src, 0))) | tail << (8 * (n - 4)),
                    0,
                )
            }
            8..=16 => {
                let tail = u128::from(u64::from_le_bytes(load(src, n - 8)));
                (
                    u128::from(u64::from_le_bytes(load(src, 0))) | tail << (8 * (n - 8)),
                    0,
                )
            }
            _ => {
                // The last eight bytes end at `n`; bytes 16.. are their top.
                let tail = u64::from_le_bytes(load(src, n - 8));
                (u128::from_le_bytes(load(src, 0)), tail >> (8 * (24 - n)))
            }
        };
        let w0 = u64::from(len) | (lo as u64) << 8;
        let w1 = (lo >> 56) as u64;
        let w2 = (lo >> 120) as u64 | hi << 8;
        let mut image = [0; 24];
        image[..8].copy_from_slice(&w0.to_le_bytes());
        image[8..16].copy_from_slice(&w1.to_le_bytes());
        image[16..].copy_from_slice(&w2.to_le_bytes());
        image
    }

    /// The name's bytes, without the UTF-8 check of [`as_str`](Self::as_str)
    /// (the bytes were copied whole from a `str`). O(1).
    #[inline]
    pub(super) fn as_bytes(&self) -> &[u8] {
        match &self.heap {
            None => self
                .image
                .get(1..1 + usize::from(self.image[0]))
                .unwrap_or(&[]),
            Some(s) => s.as_bytes(),
        }
    }

    #[inline]
    pub(super) fn as_str(&self) -> &str {
        match &self.heap {
            None => std::str::from_utf8(self.as_bytes())
                .expect("an inline spec name is copied whole from a `str`"),
            Some(s) => s,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::SpecName;

    /// An inline name keeps exactly its bytes, zero-padded, for every
    /// length that is kept inline (each branch of the chunked copy).
    #[test]
    fn inline_names_keep_their_bytes() {
        for n in 0..=SpecName::INLINE {
            let text: String = (0..n).map(|i| char::from(b'a' + (i % 26) as u8)).collect();
            let name = SpecName::new(&text);
            assert!(name.heap.is_none(), "len {n}");
            assert_eq!(name.as_str(), text);
            assert_eq!(name.as_bytes(), text.as_bytes());
            assert_eq!(usize::from(name.image[0]), n);
            assert!(
                name.image[1 + n..].iter().all(|&b| b == 0),
                "len {n}: padding"
            );
        }
        let long = "x".repeat(SpecName::INLINE + 1);
        assert_eq!(SpecName::new(&long).as_bytes(), long.as_bytes());
        assert_eq!(SpecName::new("\u{e9}t\u{e9}").as_str(), "\u{e9}t\u{e9}");
    }
}
