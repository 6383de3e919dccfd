//! The prefix queries of [`GlobalCkfIndexer`] and its search-kernel choice: the indexer's side
//! (capture the ready mask once, pick the kernel); the search itself is [`crate::search`]'s.

use std::sync::atomic::Ordering;

use crate::search::{
    self, LAZY_MIN_BLOCK_TOKENS, LAZY_MIN_BLOCKS, PrefixMatches, SearchKernel, SearchKernelError,
};
use crate::tokens::lanes::LaneBlockSizes;
use crate::tokens::{SequenceHashes, TokenQuery, TokenQueryError};

use super::indexer::GlobalCkfIndexer;

impl GlobalCkfIndexer {
    /// Prefix depth of `block_hashes` in every lane ready at capture (see the module docs for
    /// the algorithm, the read order and the weak-read contract). Allocation-free.
    ///
    /// Depths are `u32`; a query longer than `u32::MAX` blocks is cut to its first `u32::MAX`.
    /// Runs with this indexer's kernel ([`GlobalCkfIndexer::search_kernel`]: by default the best
    /// the CPU has, AVX-512 > AVX2 > portable, detected at run time); every kernel gives the
    /// same answers.
    pub fn find_prefix_matches(&self, block_hashes: &[u64]) -> PrefixMatches {
        // Relaxed: the kernel is a configuration value, and every value ever stored is one the
        // CPU runs (checked by `set_search_kernel`), so any value read is safe to run.
        let kernel = SearchKernel::from_code(self.search_kernel.load(Ordering::Relaxed));
        self.search_resolved(block_hashes, kernel)
    }

    /// Same as [`GlobalCkfIndexer::find_prefix_matches`] with the portable row check forced
    /// (for differential tests and benchmarks of the kernels).
    pub fn find_prefix_matches_portable(&self, block_hashes: &[u64]) -> PrefixMatches {
        self.search_resolved(block_hashes, SearchKernel::Portable)
    }

    /// Same as [`GlobalCkfIndexer::find_prefix_matches`] with `kernel` forced for this query
    /// (`Auto`: the best available), for differential tests and benchmarks.
    ///
    /// # Errors
    /// [`SearchKernelError::Unavailable`] when the CPU lacks `kernel`; nothing is searched.
    pub fn find_prefix_matches_with(
        &self,
        kernel: SearchKernel,
        block_hashes: &[u64],
    ) -> Result<PrefixMatches, SearchKernelError> {
        let kernel = kernel.resolve()?;
        Ok(self.search_resolved(block_hashes, kernel))
    }

    /// The kernel [`GlobalCkfIndexer::find_prefix_matches`] runs (never `Auto`).
    pub fn search_kernel(&self) -> SearchKernel {
        SearchKernel::from_code(self.search_kernel.load(Ordering::Relaxed))
    }

    /// Makes every later query run with `kernel` (`Auto`: the best available) and returns the
    /// concrete kernel now in use. Queries already running finish with the kernel they started
    /// with; all kernels give the same answers, so callers see no difference but speed.
    ///
    /// # Errors
    /// [`SearchKernelError::Unavailable`] when the CPU lacks `kernel`; the kernel in use is
    /// unchanged.
    pub fn set_search_kernel(
        &self,
        kernel: SearchKernel,
    ) -> Result<SearchKernel, SearchKernelError> {
        let kernel = kernel.resolve()?;
        // Relaxed: see `find_prefix_matches`; the value was checked just above.
        self.search_kernel.store(kernel as u8, Ordering::Relaxed);
        Ok(kernel)
    }

    /// Runs one query with a resolved (available, never `Auto`) kernel.
    #[inline]
    fn search_resolved(&self, block_hashes: &[u64], kernel: SearchKernel) -> PrefixMatches {
        // Captured once, Acquire: the lane set of this query (weak-read contract).
        self.search_ready(block_hashes, kernel, self.ready_mask())
    }

    /// Runs one query over the lanes of `ready` (the query's one capture, or a part of it).
    #[inline]
    fn search_ready(
        &self,
        block_hashes: &[u64],
        kernel: SearchKernel,
        ready: u64,
    ) -> PrefixMatches {
        search::find(
            self.table(),
            *self.addressing(),
            self.manifest().format.seed,
            kernel,
            block_hashes,
            ready,
        )
    }

    /// Prefix depth of the block hashes `block_hashes` yields, in every lane ready at capture:
    /// the same answer as [`GlobalCkfIndexer::find_prefix_matches`] on all of them collected,
    /// but the iterator is pulled only as far as some lane may still match, and on a large
    /// table the pulling overlaps the search's cache misses.
    ///
    /// For a caller that computes the hashes (a query by token ids hashes every block, and a
    /// router holding per-block hashes chains them): hashes are pulled [`LAZY_STEP`](crate::search::LAZY_STEP) at a
    /// time and each step is searched with this indexer's kernel. On a table of at least
    /// 1 MiB, the rows of each pulled hash are prefetched as it is pulled, and the step after
    /// is pulled before a step is searched, so computing the next hashes hides the misses of
    /// the current ones. The iterator is never pulled past the step after the one where the
    /// deepest lane missed (at most that lane's miss position + `2 x LAZY_STEP` hashes; on a
    /// smaller table at most its miss position + `LAZY_STEP`), never after it returned `None`,
    /// and not at all when no lane is ready. Allocation-free; depths are capped at `u32::MAX`
    /// positions as in the slice form. Each step runs the slice kernel, whose prologue locates
    /// and prefetches the step's positions again (already cached: a few instructions per hash;
    /// a loop pulling one hash per probe, without that, was tried and not shown faster with
    /// `benches/tokens.rs`).
    pub fn find_prefix_matches_lazy<I>(&self, block_hashes: I) -> PrefixMatches
    where
        I: IntoIterator<Item = u64>,
    {
        // Relaxed: as in `find_prefix_matches`.
        let kernel = SearchKernel::from_code(self.search_kernel.load(Ordering::Relaxed));
        self.search_lazy(block_hashes.into_iter(), kernel)
    }

    /// Prefix depths of a request's token blocks ([`SequenceHashes`]), as `FindMatchesByTokens`
    /// answers: the same answer as [`GlobalCkfIndexer::find_prefix_matches`] on the collected
    /// hashes, computed one of three ways (measured with `benches/tokens.rs`):
    /// * at most [`LAZY_MIN_BLOCKS`] full blocks: hashed whole onto the stack (no allocation)
    ///   and searched as a slice;
    /// * more, with at least [`LAZY_MIN_BLOCK_TOKENS`] tokens per block:
    ///   [`GlobalCkfIndexer::find_prefix_matches_lazy`], so hashing stops a step or two after
    ///   the last lane's miss, and the rows' misses overlap the (slow) hashing;
    /// * more, with smaller blocks: hashed whole into a `Vec` and searched as a slice. There
    ///   the lazy form lost, p99 at least 1.35x at 16 and 128 tokens per block (presumably its
    ///   prefetches, issued as fast as small blocks hash, overrun the core's miss buffers).
    pub fn find_prefix_matches_by_tokens(&self, hashes: SequenceHashes<'_>) -> PrefixMatches {
        // Captured once, Acquire.
        self.by_tokens_ready(hashes, self.ready_mask())
    }

    /// [`GlobalCkfIndexer::find_prefix_matches_by_tokens`] over the lanes of `ready`.
    fn by_tokens_ready(&self, hashes: SequenceHashes<'_>, ready: u64) -> PrefixMatches {
        let kernel = self.search_kernel();
        let blocks = hashes.len();
        if blocks > LAZY_MIN_BLOCKS {
            if hashes.block_size() >= LAZY_MIN_BLOCK_TOKENS {
                return self.search_lazy_ready(hashes, kernel, ready);
            }
            return self.search_ready(&hashes.collect::<Vec<u64>>(), kernel, ready);
        }
        let mut block_hashes = [0u64; LAZY_MIN_BLOCKS];
        for (slot, h) in block_hashes.iter_mut().zip(hashes) {
            *slot = h;
        }
        self.search_ready(&block_hashes[..blocks], kernel, ready)
    }

    /// Prefix depths of a request by token ids in a domain whose lanes use the block sizes
    /// `sizes` (`max_blocks`: the most blocks one query may probe): the request is hashed once
    /// per distinct block size and each lane is answered in its own blocks, as a domain of that
    /// one block size would answer it. The ready mask is captured once for all sizes. With one
    /// block size this is [`GlobalCkfIndexer::find_prefix_matches_by_tokens`] on
    /// [`TokenQuery::lazy_sequence_hashes`].
    ///
    /// # Errors
    /// [`TokenQueryError`], every check ([`LaneBlockSizes::check`]) made before any search.
    ///
    /// # Panics
    /// When `sizes` does not have this indexer's lane count.
    pub fn find_prefix_matches_by_token_query(
        &self,
        query: &TokenQuery,
        sizes: &LaneBlockSizes,
        max_blocks: u32,
    ) -> Result<PrefixMatches, TokenQueryError> {
        assert_eq!(sizes.lanes(), self.lane_count(), "one block size per lane");
        let rules = |size| LaneBlockSizes::rules(size, max_blocks);
        if let [(size, _)] = sizes.distinct() {
            let hashes = query.lazy_sequence_hashes(&rules(*size))?;
            return Ok(self.find_prefix_matches_by_tokens(hashes));
        }
        sizes.check(query, max_blocks)?;
        // Captured once, Acquire: every block size searches its part of it.
        let ready = self.ready_mask();
        let mut matches = PrefixMatches::default();
        for &(size, lanes) in sizes.distinct() {
            let hashes = query.hashes_in(&rules(size))?;
            matches.join(&self.by_tokens_ready(hashes, ready & lanes));
        }
        Ok(matches)
    }

    /// Same as [`GlobalCkfIndexer::find_prefix_matches_lazy`] with `kernel` forced for this
    /// query (`Auto`: the best available), for differential tests and benchmarks.
    ///
    /// # Errors
    /// [`SearchKernelError::Unavailable`] when the CPU lacks `kernel`; the iterator is not
    /// pulled.
    pub fn find_prefix_matches_lazy_with<I>(
        &self,
        kernel: SearchKernel,
        block_hashes: I,
    ) -> Result<PrefixMatches, SearchKernelError>
    where
        I: IntoIterator<Item = u64>,
    {
        let kernel = kernel.resolve()?;
        Ok(self.search_lazy(block_hashes.into_iter(), kernel))
    }

    /// Runs one lazy query with a resolved kernel (see [`search::search_lazy`]).
    fn search_lazy(
        &self,
        hashes: impl Iterator<Item = u64>,
        kernel: SearchKernel,
    ) -> PrefixMatches {
        // Captured once, Acquire: every step searches a subset of these lanes.
        self.search_lazy_ready(hashes, kernel, self.ready_mask())
    }

    /// [`GlobalCkfIndexer::search_lazy`] over the lanes of `ready`.
    fn search_lazy_ready(
        &self,
        hashes: impl Iterator<Item = u64>,
        kernel: SearchKernel,
        ready: u64,
    ) -> PrefixMatches {
        search::search_lazy(
            self.table(),
            *self.addressing(),
            self.manifest().format.seed,
            hashes,
            kernel,
            ready,
        )
    }
}
