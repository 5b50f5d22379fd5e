/*
 * Appended to the kernel tree's arch/x86/kernel/asm-offsets.c by guest-image/build.sh
 * (default-kernel): the few struct offsets the VMM's host-side profiler needs to name the guest
 * task a sample interrupted (vmm/src/profile/guest_task.rs). kbuild turns each OFFSET/DEFINE
 * into a line of include/generated/asm-offsets.h; build.sh copies the VPMU_ lines, with the
 * addresses of the symbols they start from (System.map) and the kernel's banner, into
 * task-layout beside the kernel. Nothing here changes the kernel's code.
 */
#include <linux/mm_types.h>
#include <linux/maple_tree.h>
#include <linux/fs.h>
#include <linux/dcache.h>

static void __used vpmu_task_layout(void)
{
	OFFSET(VPMU_task_struct_pid, task_struct, pid);
	OFFSET(VPMU_task_struct_tgid, task_struct, tgid);
	OFFSET(VPMU_task_struct_comm, task_struct, comm);
	OFFSET(VPMU_task_struct_flags, task_struct, flags);
	OFFSET(VPMU_task_struct_mm, task_struct, mm);
	OFFSET(VPMU_task_struct_stack, task_struct, stack);
	OFFSET(VPMU_task_struct_group_leader, task_struct, group_leader);
	DEFINE(VPMU_task_struct_size, sizeof(struct task_struct));
	DEFINE(VPMU_task_comm_len, TASK_COMM_LEN);
	DEFINE(VPMU_pf_kthread, PF_KTHREAD);
	OFFSET(VPMU_mm_struct_pgd, mm_struct, pgd);
	OFFSET(VPMU_mm_struct_exe_file, mm_struct, exe_file);
	OFFSET(VPMU_mm_struct_start_code, mm_struct, start_code);
	OFFSET(VPMU_mm_struct_end_code, mm_struct, end_code);
	OFFSET(VPMU_file_f_path, file, f_path);
	OFFSET(VPMU_path_dentry, path, dentry);
	OFFSET(VPMU_dentry_d_name, dentry, d_name);
	OFFSET(VPMU_dentry_d_parent, dentry, d_parent);
	OFFSET(VPMU_qstr_name, qstr, name);
	/* The task's memory map (shared libraries): mm->mm_mt, a maple tree of vm_area_structs. */
	OFFSET(VPMU_mm_struct_mm_mt, mm_struct, mm_mt);
	OFFSET(VPMU_maple_tree_ma_root, maple_tree, ma_root);
	OFFSET(VPMU_maple_range_64_pivot, maple_range_64, pivot);
	OFFSET(VPMU_maple_range_64_slot, maple_range_64, slot);
	OFFSET(VPMU_maple_range_64_meta, maple_range_64, meta);
	OFFSET(VPMU_maple_arange_64_pivot, maple_arange_64, pivot);
	OFFSET(VPMU_maple_arange_64_slot, maple_arange_64, slot);
	OFFSET(VPMU_maple_arange_64_meta, maple_arange_64, meta);
	DEFINE(VPMU_maple_range64_slots, MAPLE_RANGE64_SLOTS);
	DEFINE(VPMU_maple_arange64_slots, MAPLE_ARANGE64_SLOTS);
	OFFSET(VPMU_vm_area_struct_vm_start, vm_area_struct, vm_start);
	OFFSET(VPMU_vm_area_struct_vm_end, vm_area_struct, vm_end);
	OFFSET(VPMU_vm_area_struct_vm_file, vm_area_struct, vm_file);
	OFFSET(VPMU_vm_area_struct_vm_pgoff, vm_area_struct, vm_pgoff);
	DEFINE(VPMU_nr_cpus, NR_CPUS);
	DEFINE(VPMU_thread_size, THREAD_SIZE);
}
