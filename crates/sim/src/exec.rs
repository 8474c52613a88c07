//! Serial and parallel execution share one closure, so the `parallel`
//! feature changes speed only, never results: each chunk's work is a pure
//! function of its inputs and its offset.

/// Calls `f(offset, chunk)` for consecutive chunks of `data`, on rayon's pool
/// when the `parallel` feature is on.
pub(crate) fn for_each_chunk<T: Send>(
    data: &mut [T],
    chunk_len: usize,
    f: impl Fn(usize, &mut [T]) + Sync + Send,
) {
    #[cfg(feature = "parallel")]
    {
        use rayon::prelude::*;
        data.par_chunks_mut(chunk_len)
            .enumerate()
            .for_each(|(k, c)| f(k * chunk_len, c));
    }
    #[cfg(not(feature = "parallel"))]
    {
        data.chunks_mut(chunk_len)
            .enumerate()
            .for_each(|(k, c)| f(k * chunk_len, c));
    }
}

/// Like [`for_each_chunk`] over two equally long slices chunked in step.
pub(crate) fn for_each_chunk2<A: Send, B: Send>(
    a: &mut [A],
    b: &mut [B],
    chunk_len: usize,
    f: impl Fn(usize, &mut [A], &mut [B]) + Sync + Send,
) {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(feature = "parallel")]
    {
        use rayon::prelude::*;
        a.par_chunks_mut(chunk_len)
            .zip(b.par_chunks_mut(chunk_len))
            .enumerate()
            .for_each(|(k, (ca, cb))| f(k * chunk_len, ca, cb));
    }
    #[cfg(not(feature = "parallel"))]
    {
        a.chunks_mut(chunk_len)
            .zip(b.chunks_mut(chunk_len))
            .enumerate()
            .for_each(|(k, (ca, cb))| f(k * chunk_len, ca, cb));
    }
}
